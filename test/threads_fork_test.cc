// Threads and fork: 32 threads allocating, freeing, looking up and adding and
// removing protection domains at once; threads that exit with objects in
// jemalloc's thread cache; fork, repeatedly, with live registrations while
// other threads allocate.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

#include "test/page_oracle.h"
#include "test/test_util.h"

namespace rdmalloc_test {
namespace {

constexpr size_t kMiB = size_t{1} << 20;

bool KeysCover(const rdmalloc_keys& k, const void* p, size_t n) {
  auto a = reinterpret_cast<uintptr_t>(p), base = reinterpret_cast<uintptr_t>(k.region_base);
  return k.addr == p && k.len == n && base <= a && a + n <= base + k.region_len;
}

size_t RandomSize(std::mt19937_64& rng, size_t max_shift) {
  size_t shift = 3 + rng() % (max_shift - 2);
  return (size_t{1} << shift) + rng() % (size_t{1} << shift);
}

// ------------------------------------------------------------ 32 threads

constexpr int kThreads = 32;
constexpr int kOwners = 6;  // threads 0..5 each add and remove one pd (token)
constexpr int kOpsPerThread = 1000;

// A token's life, counted: gen % 4 == 0 removed, 1 being added, 2 open,
// 3 being removed. A lookup that saw the same even gen before and after ran
// entirely in that state.
struct Token {
  int storage;
  std::atomic<uint64_t> gen{0};
  ibv_pd* pd() { return reinterpret_cast<ibv_pd*>(&storage); }
};
Token g_tokens[kOwners];

TEST(Threads, ThirtyTwoThreadsMallocFreeLookupAddRemovePd) {
  std::atomic<uint64_t> ops{0}, checks{0}, pd_changes{0}, pd_lookups_ok{0}, pd_lookups_einval{0},
      errors{0};
  std::mutex report_mu;
  auto error = [&](const std::string& what) {
    errors++;
    std::lock_guard<std::mutex> g(report_mu);
    ADD_FAILURE() << what;
  };

  auto worker = [&](int id) {
    std::mt19937_64 rng(1000 + id);
    struct Buf {
      uint8_t* p;
      size_t n;
    };
    std::vector<Buf> live;
    Token* mine = id < kOwners ? &g_tokens[id] : nullptr;
    for (int i = 0; i < kOpsPerThread; i++) {
      int what = rng() % 20;
      if (what < 7 || live.empty()) {
        size_t n = rng() % 200 == 0 ? 36 * kMiB : RandomSize(rng, 22);
        auto* p = static_cast<uint8_t*>(rng() % 2 ? malloc(n) : calloc(1, n));
        if (p == nullptr) {
          error("allocation of " + std::to_string(n) + " failed");
          continue;
        }
        p[0] = 1;
        p[n - 1] = 2;
        live.push_back({p, n});
      } else if (what < 12) {
        size_t j = rng() % live.size();
        free(live[j].p);
        live[j] = live.back();
        live.pop_back();
      } else if (what < 14) {
        Buf b = live[rng() % live.size()];
        size_t m = std::min<size_t>(b.n, 2048);
        OracleResult r = CheckPageIdentity(b.p, b.n, b.n - m, m, rng());
        checks++;
        if (!r.ok) error("default domain: " + r.what);
      } else if (what < 17) {
        // Lookup under any token, racing with its owner.
        Buf b = live[rng() % live.size()];
        Token& t = g_tokens[rng() % kOwners];
        uint64_t g1 = t.gen.load();
        rdmalloc_keys k;
        int rc = rdmalloc_lookup(b.p, b.n, t.pd(), &k);
        uint64_t g2 = t.gen.load();
        if (rc == RDMALLOC_OK) {
          pd_lookups_ok++;
          if (g1 == g2 && g1 % 4 == 0) error("keys of a removed pd");
          if (!KeysCover(k, b.p, b.n) || k.domain < 1) error("pd keys do not cover the buffer");
        } else if (rc == RDMALLOC_EINVAL) {
          pd_lookups_einval++;
          if (g1 == g2 && g1 % 4 == 2) error("an open pd refused");
        } else {
          error("lookup under a pd returned " + std::to_string(rc));
        }
      } else if (what < 19 || mine == nullptr) {
        Buf b = live[rng() % live.size()];
        rdmalloc_keys k;
        int rc = rdmalloc_lookup(b.p, b.n, nullptr, &k);
        if (rc != RDMALLOC_OK || !KeysCover(k, b.p, b.n) || k.domain != 0)
          error("default lookup: rc " + std::to_string(rc));
      } else if (mine->gen.load() % 4 == 0) {
        mine->gen++;
        if (rdmalloc_add_pd(mine->pd(), RDMALLOC_ACCESS_LOCAL_WRITE | RDMALLOC_ACCESS_REMOTE_READ |
                                            RDMALLOC_ACCESS_REMOTE_WRITE) != RDMALLOC_OK)
          error("add_pd failed");
        mine->gen++;
        pd_changes++;
      } else {
        // Our pd is open and stays so: its keys move the buffer's bytes.
        Buf b = live[rng() % live.size()];
        rdmalloc_keys k;
        int rc = rdmalloc_lookup(b.p, b.n, mine->pd(), &k);
        struct rdmalloc_stats s = Stats();
        if (rc != RDMALLOC_OK || !KeysCover(k, b.p, b.n) || k.domain < 1 ||
            s.domain[k.domain].pd != mine->pd()) {
          error("lookup under an open pd: rc " + std::to_string(rc));
        } else {
          size_t m = std::min<size_t>(b.n, 1024);
          uint64_t seed = rng();
          FillPattern(b.p, m, seed);
          std::vector<uint8_t> nic(m);
          if (rdmalloc_dma_read(&k, 0, nic.data(), m) != RDMALLOC_OK || !HasPattern(nic.data(), m, seed))
            error("CPU->NIC through a pd's keys");
          FillPattern(nic.data(), m, seed + 1);
          if (rdmalloc_dma_write(&k, 0, nic.data(), m) != RDMALLOC_OK || !HasPattern(b.p, m, seed + 1))
            error("NIC->CPU through a pd's keys");
          checks++;
        }
        if (rng() % 3 == 0) {
          mine->gen++;
          if (rdmalloc_remove_pd(mine->pd()) != RDMALLOC_OK) error("remove_pd failed");
          mine->gen++;
          pd_changes++;
        }
      }
      ops++;
    }
    for (Buf& b : live) free(b.p);
    if (mine != nullptr && mine->gen.load() % 4 == 2) {
      mine->gen++;
      if (rdmalloc_remove_pd(mine->pd()) != RDMALLOC_OK) error("remove_pd failed");
      mine->gen++;
    }
  };

  std::vector<std::thread> threads;
  for (int i = 0; i < kThreads; i++) threads.emplace_back(worker, i);
  for (auto& t : threads) t.join();
  ForceDecay();
  struct rdmalloc_stats s = Stats();
  printf("32 threads: %llu ops, %llu DMA checks, %llu pd adds/removes, pd lookups %llu ok / %llu "
         "unknown pd, %llu errors\n",
         (unsigned long long)ops.load(), (unsigned long long)checks.load(),
         (unsigned long long)pd_changes.load(), (unsigned long long)pd_lookups_ok.load(),
         (unsigned long long)pd_lookups_einval.load(), (unsigned long long)errors.load());
  EXPECT_EQ(errors.load(), 0u);
  EXPECT_GT(pd_changes.load(), uint64_t{kOwners} * 10);
  EXPECT_GT(pd_lookups_ok.load(), 0u);
  EXPECT_GT(pd_lookups_einval.load(), 0u);
  EXPECT_EQ(s.domains, 1u);
  for (int d = 1; d < RDMALLOC_MAX_DOMAINS; d++)
    EXPECT_EQ(s.domain[d].bytes_registered, 0u) << "slot " << d;
  EXPECT_EQ(s.bytes_registered, s.domain[0].bytes_registered);
}

// --------------------------------------------- thread exit with cached objects

// Threads allocate, register, free half their objects (into their tcache) and
// exit holding the cache; other threads free the rest. Rounds after a warm-up
// must not leave regions, registrations or pins behind.
void ThreadExitRound(int round) {
  constexpr int kMakers = 16, kFreers = 4;
  std::mutex mu;
  std::vector<std::pair<void*, size_t>> handed;
  std::atomic<int> bad{0};
  auto maker = [&](int id) {
    std::mt19937_64 rng(round * 100 + id);
    std::vector<std::pair<void*, size_t>> mine;
    for (int i = 0; i < 300; i++) {
      size_t n = i % 50 == 0 ? 2 * kMiB : RandomSize(rng, 15);
      void* p = malloc(n);
      memset(p, i, std::min<size_t>(n, 256));
      if (i % 4 == 0) {
        rdmalloc_keys k;
        if (rdmalloc_lookup(p, n, nullptr, &k) != RDMALLOC_OK || !KeysCover(k, p, n)) bad++;
      }
      if (i % 60 == 0 && !CheckPageIdentity(p, n, 0, std::min<size_t>(n, 512), rng()).ok) bad++;
      mine.push_back({p, n});
    }
    for (size_t i = 0; i < mine.size(); i += 2) free(mine[i].first);  // into this thread's tcache
    std::lock_guard<std::mutex> g(mu);
    for (size_t i = 1; i < mine.size(); i += 2) handed.push_back(mine[i]);
  };
  std::vector<std::thread> makers;
  for (int i = 0; i < kMakers; i++) makers.emplace_back(maker, i);
  for (auto& t : makers) t.join();
  std::vector<std::thread> freers;
  for (int i = 0; i < kFreers; i++) {
    freers.emplace_back([&, i] {
      for (size_t j = i; j < handed.size(); j += kFreers) free(handed[j].first);
    });
  }
  for (auto& t : freers) t.join();
  ForceDecay();  // so that the next round makes its regions afresh
  EXPECT_EQ(bad.load(), 0) << "round " << round;
}

TEST(Threads, ExitWithCachedObjectsLeaksNothing) {
  ThreadExitRound(0);  // warm-up: arenas and jemalloc's metadata grow to what the rounds need
  struct rdmalloc_stats a = Stats();
  long pin_a = VmPinKbWhen([](long kb, long want) { return kb <= want; }, long(a.bytes_registered >> 10));
  for (int round = 1; round <= 6; round++) ThreadExitRound(round);
  ForceDecay();
  struct rdmalloc_stats b = Stats();
  long pin_b = VmPinKbWhen([](long kb, long want) { return kb <= want; }, pin_a);
  printf("thread exit: after warm-up %llu regions, %llu MiB registered, VmPin %ld kB; after 6 "
         "rounds (%llu regions made, %llu released) %llu regions, %llu MiB registered, VmPin %ld kB\n",
         (unsigned long long)a.regions_live, (unsigned long long)(a.bytes_registered >> 20), pin_a,
         (unsigned long long)(b.regions_created - a.regions_created),
         (unsigned long long)(b.regions_released - a.regions_released),
         (unsigned long long)b.regions_live, (unsigned long long)(b.bytes_registered >> 20), pin_b);
  EXPECT_GT(b.regions_released, a.regions_released) << "the rounds released regions";
  EXPECT_LE(b.regions_live, a.regions_live);
  EXPECT_LE(b.bytes_registered, a.bytes_registered);
  EXPECT_LE(b.bytes_pinned, a.bytes_pinned);
  EXPECT_LE(pin_b, pin_a);
}

// ----------------------------------------------------------------- fork

// The child's checks; each failure sets one bit of the exit status.
int ChildChecks(uint8_t* p, size_t n, uint64_t seed, const rdmalloc_keys& parent_keys) {
  int fails = 0;
  if (!HasPattern(p, std::min<size_t>(n, 65536), seed)) fails |= 1;
  // Registrations belong to the parent: the child starts with none.
  struct rdmalloc_stats s0 = Stats();
  if (s0.bytes_registered != 0 || s0.bytes_pinned != 0) fails |= 2;
  std::mt19937_64 rng(seed);
  std::vector<void*> v;
  for (int i = 0; i < 2000; i++) {
    void* q = malloc(RandomSize(rng, 18));
    if (q == nullptr) fails |= 4;
    v.push_back(q);
    if (i % 3 == 0) {
      size_t j = rng() % v.size();
      free(v[j]);
      v[j] = v.back();
      v.pop_back();
    }
  }
  for (void* q : v) free(q);
  v.clear();
  // The parent's keys name the parent's registration, which the child
  // forgot: they move nothing here.
  uint8_t byte;
  if (rdmalloc_dma_read(&parent_keys, 0, &byte, 1) == RDMALLOC_OK) fails |= 128;
  // The child registers in its own process, for inherited and new buffers.
  rdmalloc_keys k;
  if (rdmalloc_lookup(p, n, nullptr, &k) != RDMALLOC_OK || !KeysCover(k, p, n)) fails |= 8;
  if (!CheckPageIdentity(p, n, 0, std::min<size_t>(n, 65536), seed + 7).ok) fails |= 16;
  if (VmPinKb() < static_cast<long>(k.region_len >> 10)) fails |= 32;
  void* fresh = malloc(3 * kMiB);
  if (!CheckPageIdentity(fresh, 3 * kMiB, 0, 3 * kMiB, seed + 9).ok) fails |= 64;
  free(fresh);
  return fails;
}

TEST(Fork, RepeatedWithLiveRegistrationsWhileThreadsAllocate) {
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> churn_ops{0}, churn_bad{0};
  auto churn = [&](int id) {
    std::mt19937_64 rng(7000 + id);
    std::vector<std::pair<uint8_t*, size_t>> live;
    while (!stop.load()) {
      if (live.size() < 64 && rng() % 2) {
        size_t n = RandomSize(rng, 21);
        auto* p = static_cast<uint8_t*>(malloc(n));
        p[n - 1] = 1;
        live.push_back({p, n});
      } else if (!live.empty()) {
        size_t j = rng() % live.size();
        auto [p, n] = live[j];
        if (rng() % 8 == 0 && !CheckPageIdentity(p, n, 0, std::min<size_t>(n, 1024), rng()).ok)
          churn_bad++;
        free(p);
        live[j] = live.back();
        live.pop_back();
      }
      churn_ops++;
    }
    for (auto& [p, n] : live) free(p);
  };
  std::vector<std::thread> threads;
  for (int i = 0; i < 6; i++) threads.emplace_back(churn, i);

  struct Held {
    uint8_t* p;
    size_t n;
    uint64_t seed;
    rdmalloc_keys k;
  };
  std::vector<Held> held;
  constexpr int kForks = 16;
  int children_ok = 0;
  for (int i = 0; i < kForks; i++) {
    Held h;
    h.n = (i % 3 + 1) * kMiB + i * 4096;
    h.p = static_cast<uint8_t*>(malloc(h.n));
    h.seed = 500 + i;
    FillPattern(h.p, h.n, h.seed);
    ASSERT_EQ(rdmalloc_lookup(h.p, h.n, nullptr, &h.k), RDMALLOC_OK);
    held.push_back(h);
    pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) _exit(ChildChecks(h.p, h.n, h.seed, h.k));
    int status = 0;
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
    ASSERT_TRUE(WIFEXITED(status)) << "fork " << i << ": child died, status " << status;
    EXPECT_EQ(WEXITSTATUS(status), 0) << "fork " << i << ": failed checks (bits) " << WEXITSTATUS(status);
    children_ok += WIFEXITED(status) && WEXITSTATUS(status) == 0;
    // Every buffer registered before any fork so far: the CPU sees what it
    // wrote (the children's writes stayed theirs), the keys taken before the
    // fork still move the same bytes both ways.
    for (Held& o : held) {
      ASSERT_TRUE(HasPattern(o.p, o.n, o.seed)) << "fork " << i;
      std::vector<uint8_t> nic(4096);
      ASSERT_EQ(rdmalloc_dma_read(&o.k, o.n - 4096, nic.data(), 4096), RDMALLOC_OK);
      EXPECT_EQ(memcmp(nic.data(), o.p + o.n - 4096, 4096), 0) << "fork " << i;
      FillPattern(nic.data(), 4096, o.seed + 1000 + i);
      ASSERT_EQ(rdmalloc_dma_write(&o.k, 0, nic.data(), 4096), RDMALLOC_OK);
      EXPECT_EQ(memcmp(nic.data(), o.p, 4096), 0) << "fork " << i;
      FillPattern(o.p, 4096, o.seed);  // restore the CPU's pattern
    }
  }
  stop = true;
  for (auto& t : threads) t.join();
  for (Held& h : held) free(h.p);
  printf("fork: %d forks, %d children passed, %llu concurrent ops by 6 threads, %llu bad\n", kForks,
         children_ok, (unsigned long long)churn_ops.load(), (unsigned long long)churn_bad.load());
  EXPECT_EQ(churn_bad.load(), 0u);
}

}  // namespace
}  // namespace rdmalloc_test
