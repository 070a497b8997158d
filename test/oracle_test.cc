// The page-identity oracle under a randomized multi-threaded workload: for
// live buffers, bytes written through the registration are what the CPU sees
// and vice versa, across malloc/calloc/realloc/posix_memalign/free, sizes from
// 8 B to 64 MiB, and forced decay between phases.
#include <gtest/gtest.h>
#include <malloc.h>
#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <barrier>
#include <cstdlib>
#include <random>
#include <thread>
#include <vector>

#include "test/page_oracle.h"
#include "test/test_util.h"

namespace rdmalloc_test {
namespace {

constexpr int kThreads = 8;
constexpr int kPhases = 4;
constexpr int kOpsPerThreadPerPhase = 3500;  // 8 * 4 * 3500 = 112000 operations
constexpr size_t kMaxLiveBytesPerThread = size_t{96} << 20;

struct Buffer {
  uint8_t* p;
  size_t size;
  uint64_t seed;  // the CPU-side pattern in its probe windows
};

// Probe windows: the first and last pages of a buffer carry its pattern, so
// that patterning a 64 MiB buffer costs as much as a small one.
constexpr size_t kProbe = 4096;

size_t TailStart(const Buffer& b) { return std::max(std::min(b.size, kProbe), b.size - std::min(b.size, kProbe)); }

void FillProbes(const Buffer& b) {
  FillPattern(b.p, std::min(b.size, kProbe), b.seed);
  FillPattern(b.p + TailStart(b), b.size - TailStart(b), b.seed + 2);
}

bool HasProbes(const Buffer& b) {
  return HasPattern(b.p, std::min(b.size, kProbe), b.seed) &&
         HasPattern(b.p + TailStart(b), b.size - TailStart(b), b.seed + 2);
}

size_t RandomSize(std::mt19937_64& rng) {
  // Log-uniform from 8 B to 64 MiB, so that small sizes dominate as in real
  // programs but every size class, large extent and region size is hit.
  std::uniform_real_distribution<double> d(std::log2(8.0), std::log2(64.0 * (1 << 20)));
  return static_cast<size_t>(std::exp2(d(rng)));
}

struct Counters {
  std::atomic<uint64_t> checks{0}, mismatches{0}, ops{0};
};

void CheckSample(Buffer& b, std::mt19937_64& rng, Counters& c) {
  size_t n = std::min<size_t>(b.size, 16 << 10);
  size_t off = b.size > n ? std::uniform_int_distribution<size_t>(0, b.size - n)(rng) : 0;
  uint64_t seed = rng();
  OracleResult r = CheckPageIdentity(b.p, b.size, off, n, seed);
  c.checks++;
  if (!r.ok) {
    c.mismatches++;
    ADD_FAILURE() << r.what << " on a " << b.size << "-byte buffer " << static_cast<void*>(b.p)
                  << " at offset " << off << " (foreign extents: " << Stats().foreign_extents << ")";
  }
  FillProbes(b);  // the oracle overwrote [off, off+n)
}

void Worker(int id, std::barrier<>& phase_end, Counters& c) {
  std::mt19937_64 rng(0xC0FFEE + id);
  std::vector<Buffer> live;
  size_t live_bytes = 0;
  auto drop = [&](size_t i) {
    live_bytes -= live[i].size;
    free(live[i].p);
    live[i] = live.back();
    live.pop_back();
  };
  for (int phase = 0; phase < kPhases; phase++) {
    for (int op = 0; op < kOpsPerThreadPerPhase; op++) {
      c.ops++;
      int kind = std::uniform_int_distribution<int>(0, 9)(rng);
      if ((kind < 4 || live.empty()) && live_bytes < kMaxLiveBytesPerThread) {
        size_t size = RandomSize(rng);
        Buffer b{nullptr, size, rng()};
        int how = std::uniform_int_distribution<int>(0, 2)(rng);
        if (how == 0) {
          b.p = static_cast<uint8_t*>(malloc(size));
        } else if (how == 1) {
          b.p = static_cast<uint8_t*>(calloc(1, size));
          ASSERT_NE(b.p, nullptr);
          // Reused pages must read as zero to the CPU and through the NIC.
          size_t n = std::min<size_t>(size, 4096);
          std::vector<uint8_t> nic(n, 0xFF);
          rdmalloc_keys k;
          ASSERT_EQ(rdmalloc_lookup(b.p, size, nullptr, &k), RDMALLOC_OK);
          ASSERT_EQ(rdmalloc_dma_read(&k, size - n, nic.data(), n), RDMALLOC_OK);
          size_t head = std::min(size, kProbe);
          bool zero = std::all_of(b.p, b.p + head, [](uint8_t v) { return v == 0; }) &&
                      std::all_of(b.p + size - n, b.p + size, [](uint8_t v) { return v == 0; }) &&
                      std::all_of(nic.begin(), nic.end(), [](uint8_t v) { return v == 0; });
          if (!zero) {
            c.mismatches++;
            ADD_FAILURE() << "calloc(" << size << ") not zero";
          }
        } else {
          size_t align = size_t{16} << std::uniform_int_distribution<int>(0, 13)(rng);
          void* q = nullptr;
          ASSERT_EQ(posix_memalign(&q, align, size), 0);
          ASSERT_EQ(reinterpret_cast<uintptr_t>(q) % align, 0u);
          b.p = static_cast<uint8_t*>(q);
        }
        ASSERT_NE(b.p, nullptr);
        FillProbes(b);
        live.push_back(b);
        live_bytes += size;
      } else if (kind < 6 && !live.empty()) {
        drop(std::uniform_int_distribution<size_t>(0, live.size() - 1)(rng));
      } else if (kind < 7 && !live.empty()) {
        Buffer& b = live[std::uniform_int_distribution<size_t>(0, live.size() - 1)(rng)];
        size_t size = RandomSize(rng);
        if (live_bytes - b.size + size > kMaxLiveBytesPerThread) continue;
        auto* q = static_cast<uint8_t*>(realloc(b.p, size));
        ASSERT_NE(q, nullptr);
        size_t kept = std::min({size, b.size, kProbe});
        if (!HasPattern(q, kept, b.seed)) {
          c.mismatches++;
          ADD_FAILURE() << "realloc lost contents";
        }
        live_bytes = live_bytes - b.size + size;
        b.p = q;
        b.size = size;
        FillProbes(b);
      } else if (!live.empty()) {
        CheckSample(live[std::uniform_int_distribution<size_t>(0, live.size() - 1)(rng)], rng, c);
      }
    }
    // Everything still live must still hold its own pattern after the phase.
    for (Buffer& b : live) {
      if (!HasProbes(b)) {
        c.mismatches++;
        ADD_FAILURE() << "a live buffer changed under the workload";
      }
    }
    mallctl("thread.tcache.flush", nullptr, nullptr, nullptr, 0);
    phase_end.arrive_and_wait();  // main thread forces decay
    phase_end.arrive_and_wait();
    for (int i = 0; i < 8 && !live.empty(); i++) {
      CheckSample(live[std::uniform_int_distribution<size_t>(0, live.size() - 1)(rng)], rng, c);
    }
  }
  while (!live.empty()) drop(live.size() - 1);
}

TEST(PageOracle, RandomizedMultiThreadedWorkloadHasNoMismatch) {
  ASSERT_STREQ(rdmalloc_backend(), "uring") << "the oracle needs the io_uring soft NIC";
  Counters c;
  std::barrier<> phase_end(kThreads + 1);
  std::vector<std::thread> threads;
  for (int i = 0; i < kThreads; i++) threads.emplace_back(Worker, i, std::ref(phase_end), std::ref(c));
  uint64_t released_before = Stats().regions_released;
  for (int phase = 0; phase < kPhases; phase++) {
    phase_end.arrive_and_wait();
    ForceDecay();
    phase_end.arrive_and_wait();
  }
  for (auto& t : threads) t.join();
  ForceDecay();
  struct rdmalloc_stats s = Stats();
  printf("oracle: %llu operations, %llu page-identity checks, %llu mismatches, "
         "%llu regions released, %llu reg / %llu dereg calls\n",
         (unsigned long long)c.ops.load(), (unsigned long long)c.checks.load(),
         (unsigned long long)c.mismatches.load(),
         (unsigned long long)(s.regions_released - released_before),
         (unsigned long long)s.reg_calls, (unsigned long long)s.dereg_calls);
  EXPECT_GE(c.ops.load(), 100000u);
  EXPECT_GT(c.checks.load(), 5000u);
  EXPECT_EQ(c.mismatches.load(), 0u);
  // Decay really released regions (registered ones included) during the run.
  EXPECT_GT(s.regions_released - released_before, 0u);
  EXPECT_GT(s.dereg_calls, 0u);
}

// Negative control: purge a registered range behind rdmalloc's back (what a
// registration-unaware allocator does) and the oracle must catch it.
TEST(PageOracle, NegativeControlPurgeBehindOurBackIsDetected) {
  const size_t size = size_t{1} << 20;
  auto* p = static_cast<uint8_t*>(aligned_alloc(4096, size));
  ASSERT_NE(p, nullptr);
  FillPattern(p, size, 7);
  ASSERT_TRUE(CheckPageIdentity(p, size, 0, size, 11).ok) << "healthy before the purge";
  ASSERT_EQ(madvise(p, size, MADV_DONTNEED), 0);
  OracleResult r = CheckPageIdentity(p, size, 0, size, 13);
  EXPECT_FALSE(r.ok) << "the oracle missed a purged registered page";
  EXPECT_EQ(r.what, "NIC->CPU mismatch");
  free(p);
}

}  // namespace
}  // namespace rdmalloc_test
