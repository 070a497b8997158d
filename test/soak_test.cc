// Soak: at least 10^6 operations across threads (malloc, calloc,
// posix_memalign, realloc and free of 8 B .. 8 MiB, lookups, page-identity
// checks through the io_uring oracle in both directions) while other threads
// force decay, fork (the child runs a short workload and exits 0) and add and
// remove protection domains. Checked: no mismatch of any kind; at the end,
// with only a known live set left, pinned memory is at most that live set
// plus one region per arena.
//
// Runs for SOAK_SECONDS or --soak_seconds=N (default 60) and until
// 10^6 operations are done, whichever is later.
#include <gtest/gtest.h>
#include <jemalloc/jemalloc.h>
#include <malloc.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "test/page_oracle.h"
#include "test/test_util.h"

namespace rdmalloc_test {
namespace {

double g_soak_seconds = 60;
constexpr uint64_t kMinOps = 1000000;
constexpr int kWorkers = 8;
constexpr int kLiveSetPerWorker = 4;
constexpr size_t kMaxLiveBytesPerWorker = size_t{24} << 20;
constexpr size_t kProbe = 64;  // bytes of pattern at each end of a buffer
constexpr int kTokens = 3;

struct Buf {
  uint8_t* p;
  size_t n;
  uint64_t seed;
};

size_t RandomSize(std::mt19937_64& rng) {
  // Log-uniform 8 B .. 8 MiB: small sizes dominate, every class is hit.
  std::uniform_real_distribution<double> d(3.0, 23.0);
  return static_cast<size_t>(std::exp2(d(rng)));
}

// The tail probe never overlaps the head one (small buffers have none).
size_t HeadLen(const Buf& b) { return std::min(b.n, kProbe); }
size_t TailAt(const Buf& b) { return std::max(HeadLen(b), b.n - HeadLen(b)); }

void FillProbes(const Buf& b) {
  FillPattern(b.p, HeadLen(b), b.seed);
  FillPattern(b.p + TailAt(b), b.n - TailAt(b), b.seed + 1);
}
bool HasProbes(const Buf& b) {
  return HasPattern(b.p, HeadLen(b), b.seed) && HasPattern(b.p + TailAt(b), b.n - TailAt(b), b.seed + 1);
}
bool ZeroProbes(const Buf& b) {
  auto zero = [](const uint8_t* p, size_t n) { return std::all_of(p, p + n, [](uint8_t v) { return v == 0; }); };
  return zero(b.p, HeadLen(b)) && zero(b.p + TailAt(b), b.n - TailAt(b));
}

bool KeysCover(const rdmalloc_keys& k, const void* p, size_t n) {
  auto a = reinterpret_cast<uintptr_t>(p), base = reinterpret_cast<uintptr_t>(k.region_base);
  return k.addr == p && k.len == n && base <= a && a + n <= base + k.region_len;
}

struct Counters {
  std::atomic<uint64_t> ops{0}, oracle_checks{0}, lookups{0}, mismatches{0}, forks{0},
      fork_failures{0}, decays{0}, pd_changes{0};
};

int g_tokens[kTokens];
ibv_pd* Token(int i) { return reinterpret_cast<ibv_pd*>(&g_tokens[i]); }

std::mutex g_report_mu;
void Mismatch(Counters& c, const std::string& what) {
  // The first few in full; the count says the rest.
  if (c.mismatches++ >= 20) return;
  std::lock_guard<std::mutex> g(g_report_mu);
  ADD_FAILURE() << what;
}

// Oracle on a window of b (both directions), then the probes are restored
// (the window may overlap them).
void Oracle(Buf& b, std::mt19937_64& rng, Counters& c) {
  size_t n = std::min<size_t>(b.n, 4096);
  size_t off = b.n > n ? rng() % (b.n - n + 1) : 0;
  OracleResult r = CheckPageIdentity(b.p, b.n, off, n, rng());
  c.oracle_checks++;
  if (!r.ok) Mismatch(c, r.what + " on a " + std::to_string(b.n) + "-byte buffer");
  FillProbes(b);
}

void Worker(int id, std::atomic<bool>& stop, Counters& c, std::vector<Buf>& live_set_out) {
  std::mt19937_64 rng(0x50A4 + id);
  uint64_t next_seed = uint64_t(id) << 40;
  // The live set: made first (long-lived data), checked now and then, kept.
  std::vector<Buf> keep;
  for (int i = 0; i < kLiveSetPerWorker; i++) {
    Buf b{static_cast<uint8_t*>(malloc(RandomSize(rng))), 0, next_seed += 2};
    b.n = malloc_usable_size(b.p);
    FillProbes(b);
    keep.push_back(b);
  }
  std::vector<Buf> live;
  size_t live_bytes = 0;
  auto drop = [&](size_t i) {
    live_bytes -= live[i].n;
    live[i] = live.back();
    live.pop_back();
  };
  while (!stop.load(std::memory_order_relaxed)) {
    int what = rng() % 100;
    if (live.empty() || (what < 30 && live_bytes < kMaxLiveBytesPerWorker)) {
      size_t n = RandomSize(rng);
      Buf b{nullptr, n, next_seed += 2};
      int how = rng() % 3;
      void* p = nullptr;
      if (how == 0) p = malloc(n);
      if (how == 1) p = calloc(1, n);
      if (how == 2 && posix_memalign(&p, size_t{64} << (rng() % 8), n) != 0) p = nullptr;
      if (p == nullptr) {
        Mismatch(c, "allocation of " + std::to_string(n) + " bytes failed");
        continue;
      }
      b.p = static_cast<uint8_t*>(p);
      if (how == 1 && !ZeroProbes(b)) Mismatch(c, "calloc returned non-zero bytes");
      FillProbes(b);
      live.push_back(b);
      live_bytes += n;
    } else if (what < 48) {
      size_t i = rng() % live.size();
      if (!HasProbes(live[i])) Mismatch(c, "a live buffer's bytes changed (at free)");
      free(live[i].p);
      drop(i);
    } else if (what < 58) {
      size_t i = rng() % live.size();
      Buf& b = live[i];
      if (!HasProbes(b)) Mismatch(c, "a live buffer's bytes changed (before realloc)");
      size_t n = RandomSize(rng);
      auto* p = static_cast<uint8_t*>(realloc(b.p, n));
      if (p == nullptr) {
        Mismatch(c, "realloc to " + std::to_string(n) + " failed");
        continue;
      }
      // The head probe survives (realloc keeps min(old, new) bytes).
      if (!HasPattern(p, std::min(HeadLen(b), n), b.seed)) Mismatch(c, "realloc lost bytes");
      live_bytes = live_bytes - b.n + n;
      b = Buf{p, n, next_seed += 2};
      FillProbes(b);
    } else if (what < 83) {
      Buf& b = live[rng() % live.size()];
      rdmalloc_keys k;
      c.lookups++;
      int rc = rdmalloc_lookup(b.p, b.n, nullptr, &k);
      if (rc != RDMALLOC_OK || !KeysCover(k, b.p, b.n))
        Mismatch(c, "lookup returned " + std::to_string(rc) + " or keys that miss the buffer");
    } else if (what < 88) {
      // Under a pd that comes and goes: keys that cover, or "unknown pd".
      Buf& b = live[rng() % live.size()];
      rdmalloc_keys k;
      c.lookups++;
      int rc = rdmalloc_lookup(b.p, b.n, Token(rng() % kTokens), &k);
      if (!(rc == RDMALLOC_EINVAL || (rc == RDMALLOC_OK && KeysCover(k, b.p, b.n) && k.domain > 0)))
        Mismatch(c, "lookup under a pd returned " + std::to_string(rc));
    } else if (what < 97) {
      Oracle(live[rng() % live.size()], rng, c);
    } else {
      Buf& b = keep[rng() % keep.size()];
      if (!HasProbes(b)) Mismatch(c, "a live-set buffer's bytes changed");
      Oracle(b, rng, c);
    }
    c.ops.fetch_add(1, std::memory_order_relaxed);
  }
  for (Buf& b : live) {
    if (!HasProbes(b)) Mismatch(c, "a live buffer's bytes changed (at the end)");
    free(b.p);
  }
  std::lock_guard<std::mutex> g(g_report_mu);
  live_set_out.insert(live_set_out.end(), keep.begin(), keep.end());
}

// The child of a fork: a short workload of its own, including registering
// in its own process; exits 0 if everything held.
int ChildWorkload(Buf& held) {
  if (!HasProbes(held)) return 1;
  std::mt19937_64 rng(getpid());
  std::vector<Buf> bufs;
  for (int i = 0; i < 200; i++) {
    Buf b{static_cast<uint8_t*>(malloc(RandomSize(rng))), 0, rng()};
    if (b.p == nullptr) return 2;
    b.n = malloc_usable_size(b.p);
    FillProbes(b);
    bufs.push_back(b);
  }
  for (int i = 0; i < 8; i++) {
    Buf& b = bufs[rng() % bufs.size()];
    size_t n = std::min<size_t>(b.n, 4096);
    if (!CheckPageIdentity(b.p, b.n, 0, n, rng()).ok) return 3;
  }
  if (!CheckPageIdentity(held.p, held.n, 0, std::min<size_t>(held.n, 4096), rng()).ok) return 4;
  for (Buf& b : bufs) free(b.p);
  return 0;
}

TEST(Soak, MillionOperationsWithDecayForkAndDomainChurn) {
  ASSERT_EQ(getenv("RDMALLOC_REGION_SIZE"), nullptr) << "the bound below assumes 64 MiB regions";
  Counters c;
  std::atomic<bool> stop{false};
  std::vector<Buf> live_set;
  std::vector<std::thread> threads;
  for (int i = 0; i < kWorkers; i++) threads.emplace_back(Worker, i, std::ref(stop), std::ref(c), std::ref(live_set));
  threads.emplace_back([&] {
    while (!stop.load()) {
      mallctl("arena.4096.purge", nullptr, nullptr, nullptr, 0);
      c.decays++;
      std::this_thread::sleep_for(std::chrono::milliseconds(250));
    }
  });
  threads.emplace_back([&] {
    std::mt19937_64 rng(77);
    while (!stop.load()) {
      int i = rng() % kTokens;
      if (rdmalloc_add_pd(Token(i), RDMALLOC_ACCESS_LOCAL_WRITE) == RDMALLOC_OK ||
          rdmalloc_remove_pd(Token(i)) == RDMALLOC_OK)
        c.pd_changes++;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  });
  threads.emplace_back([&] {
    // A registered buffer of this thread's own: the child checks it.
    Buf held{static_cast<uint8_t*>(malloc(3 << 20)), 3 << 20, 4242};
    FillProbes(held);
    rdmalloc_keys k;
    if (rdmalloc_lookup(held.p, held.n, nullptr, &k) != RDMALLOC_OK) Mismatch(c, "lookup before fork");
    while (!stop.load()) {
      std::this_thread::sleep_for(std::chrono::seconds(2));
      pid_t pid = fork();
      if (pid == 0) _exit(ChildWorkload(held));
      int status = -1;
      if (pid < 0 || waitpid(pid, &status, 0) != pid || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        c.fork_failures++;
        Mismatch(c, "fork child failed, status " + std::to_string(status));
      }
      c.forks++;
      // The parent's keys from before the fork still move its bytes.
      std::vector<uint8_t> nic(kProbe);
      if (rdmalloc_dma_read(&k, 0, nic.data(), kProbe) != RDMALLOC_OK || !HasPattern(nic.data(), kProbe, held.seed))
        Mismatch(c, "parent keys after fork");
    }
    free(held.p);
  });

  double start = NowSeconds();
  while (NowSeconds() - start < g_soak_seconds || c.ops.load() < kMinOps)
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  stop = true;
  for (auto& t : threads) t.join();
  double elapsed = NowSeconds() - start;
  for (int i = 0; i < kTokens; i++) rdmalloc_remove_pd(Token(i));

  // Only the live set is left: check it, then measure what stays pinned.
  ForceDecay();
  std::mt19937_64 rng(5);
  size_t live_bytes = 0;
  for (Buf& b : live_set) {
    if (!HasProbes(b)) Mismatch(c, "a live-set buffer's bytes changed (end)");
    Oracle(b, rng, c);
    live_bytes += b.n;
  }
  ForceDecay();
  struct rdmalloc_stats s = Stats();
  unsigned narenas = 0;
  size_t len = sizeof narenas;
  ASSERT_EQ(mallctl("arenas.narenas", &narenas, &len, nullptr, 0), 0);
  // rdmalloc's default region size (RDMALLOC_REGION_SIZE is not set here).
  const uint64_t region = uint64_t{64} << 20;
  const uint64_t bound = live_bytes + narenas * region;
  long pin_kb = VmPinKbWhen([](long kb, long want) { return kb <= want; }, long(bound >> 10));
  printf("soak: %.0f s, %llu operations (%llu lookups, %llu page-identity checks) across %d "
         "threads, %llu forks (%llu failed), %llu decays, %llu pd adds/removes, %llu mismatches; "
         "at the end: live set %zu buffers %.1f MiB, pinned %.1f MiB (stats bytes_pinned), "
         "VmPin %.1f MiB, bound %.1f MiB = live + %u arenas x 64 MiB; regions made %llu, "
         "released %llu, live %llu\n",
         elapsed, (unsigned long long)c.ops.load(), (unsigned long long)c.lookups.load(),
         (unsigned long long)c.oracle_checks.load(), kWorkers, (unsigned long long)c.forks.load(),
         (unsigned long long)c.fork_failures.load(), (unsigned long long)c.decays.load(),
         (unsigned long long)c.pd_changes.load(), (unsigned long long)c.mismatches.load(),
         live_set.size(), live_bytes / 1048576.0, s.bytes_pinned / 1048576.0, pin_kb / 1024.0,
         bound / 1048576.0, narenas, (unsigned long long)s.regions_created,
         (unsigned long long)s.regions_released, (unsigned long long)s.regions_live);
  EXPECT_EQ(c.mismatches.load(), 0u);
  EXPECT_GE(c.ops.load(), kMinOps);
  EXPECT_GT(c.forks.load(), 0u);
  EXPECT_GT(c.pd_changes.load(), 0u);
  EXPECT_GT(s.regions_released, 0u);
  EXPECT_EQ(s.domains, 1u);
  EXPECT_LE(s.bytes_pinned, bound);
  EXPECT_LE(s.bytes_registered, bound);
  EXPECT_LE(uint64_t(pin_kb) << 10, bound);
  if (s.bytes_pinned > bound) rdmalloc_dump_regions(stdout);
  for (Buf& b : live_set) free(b.p);
}

}  // namespace
}  // namespace rdmalloc_test

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  if (const char* v = getenv("SOAK_SECONDS")) rdmalloc_test::g_soak_seconds = atof(v);
  for (int i = 1; i < argc; i++) {
    if (strncmp(argv[i], "--soak_seconds=", 15) == 0) rdmalloc_test::g_soak_seconds = atof(argv[i] + 15);
  }
  return RUN_ALL_TESTS();
}
