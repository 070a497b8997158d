// The page heap (rdmalloc::Heap) driven from many threads through its internal
// API: extents taken and given back as jemalloc's hooks would, lookups of
// one's own and of other threads' extents (racing with their release), dma
// through the keys, domains added and removed, stats and region dumps.
//
// No jemalloc and no malloc replacement here, so the binary can run under
// ThreadSanitizer with tsan's own malloc (--config=tsan; docs/TESTING.md):
// the heap's locks, seqlocks and release hand-offs are all instrumented.
// The backend comes from RDMALLOC_BACKEND (see BUILD: uring, and verbs over
// the stand-in libibverbs, whose registrations release through the deferred
// path).
#include <errno.h>
#include <gtest/gtest.h>
#include <stdio.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "allocator/config.h"
#include "allocator/heap.h"

namespace rdmalloc {
namespace {

constexpr int kThreads = 4;
constexpr int kSlotsPerThread = 8;

void IgnoreWarning(const char*) {}
const char* GetEnv(const char* name) { return getenv(name); }

// Configured once per process, as malloc's initialisation would.
Heap& StartedHeap() {
  static bool started = [] {
    TheHeap().Configure(ParseConfig(GetEnv, IgnoreWarning));
    TheHeap().Start();
    return true;
  }();
  (void)started;
  return TheHeap();
}

bool UringBackend() { return strcmp(StartedHeap().BackendName(), "uring") == 0; }

// An extent a thread owns, published so that other threads can look it up.
struct Published {
  std::atomic<uintptr_t> addr{0};
  std::atomic<size_t> size{0};
};

uint64_t Word(uint64_t seed, size_t i) { return seed * 0x9E3779B97F4A7C15ull + i; }

// Pages per extent: mostly small, some of several regions' worth (dedicated
// regions when RDMALLOC_REGION_SIZE is small).
size_t PickPages(std::mt19937_64& rng) {
  switch (rng() % 8) {
    case 0: return 512 + rng() % 1024;
    case 1: case 2: return 16 + rng() % 240;
    default: return 1 + rng() % 16;
  }
}

size_t PickAlignment(std::mt19937_64& rng) {
  switch (rng() % 6) {
    case 0: return size_t{2} << 20;
    case 1: return size_t{64} << 10;
    default: return kPageSize;
  }
}

void ExpectCovers(const rdmalloc_keys& k, uintptr_t a, size_t n) {
  uintptr_t base = reinterpret_cast<uintptr_t>(k.region_base);
  EXPECT_LE(base, a);
  EXPECT_LE(a - base + n, k.region_len);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(k.addr), a);
  EXPECT_EQ(k.len, n);
}

// Everything the heap's Stats tells once all extents are back and the kept
// ones are given back. Deferred releases finish on the heap's release
// thread: give it a few seconds.
void ExpectEmpty(Heap& heap) {
  heap.GiveBackRetained();  // what RDMALLOC_RETAIN keeps for reuse
  struct rdmalloc_stats s;
  for (int i = 0; i < 500; i++) {
    ASSERT_EQ(heap.Stats(&s, sizeof s), RDMALLOC_OK);
    if (s.regions_live == 0) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(s.bytes_in_use, 0u);
  EXPECT_EQ(s.regions_live, 0u);
  EXPECT_EQ(s.bytes_mapped, 0u);
  EXPECT_EQ(s.bytes_registered, 0u);
  EXPECT_EQ(s.bytes_pinned, 0u);
  EXPECT_EQ(s.reg_calls, s.dereg_calls + s.reg_failures);
}

void Worker(Heap& heap, int id, int rounds, Published* table, std::atomic<int>* failures) {
  std::mt19937_64 rng(1000 + id);
  bool dma = UringBackend();
  Published* mine = &table[id * kSlotsPerThread];
  for (int round = 0; round < rounds; round++) {
    Published& slot = mine[rng() % kSlotsPerThread];
    uintptr_t old = slot.addr.load(std::memory_order_relaxed);
    if (old != 0) {
      size_t size = slot.size.load(std::memory_order_relaxed);
      slot.addr.store(0, std::memory_order_relaxed);
      // Still ours and intact: no other thread's extent overlapped it.
      auto* words = reinterpret_cast<uint64_t*>(old);
      size_t last = size / sizeof(uint64_t) - 1;
      if (words[0] != Word(old, 0) || words[last] != Word(old, last)) failures->fetch_add(1);
      Region* r = heap.RegionOf(reinterpret_cast<void*>(old), size);
      if (r == nullptr) {
        failures->fetch_add(1);
        continue;
      }
      heap.FreeExtent(r, reinterpret_cast<void*>(old), size, rdmalloc::Heap::Freed::kWarm,
                      heap.HeldBlock(r, reinterpret_cast<void*>(old), size));
      continue;
    }
    size_t size = PickPages(rng) << kPageShift;
    size_t align = PickAlignment(rng);
    bool zero = rng() % 2 == 0;
    bool asked_zero = zero;
    // Mostly the plain heap, some remote-access classes (regions of their own).
    unsigned access_class = rng() % 4 == 0 ? 1 + rng() % (kAccessClasses - 1) : 0;
    // Each worker is an arena of its own (shard); frees of others' extents
    // (below) cross shards.
    void* p = heap.AllocExtent(static_cast<unsigned>(id), access_class, nullptr, size, align, &zero);
    if (p == nullptr) {
      failures->fetch_add(1);
      continue;
    }
    uintptr_t a = reinterpret_cast<uintptr_t>(p);
    EXPECT_EQ(a % align, 0u);
    auto* words = static_cast<uint64_t*>(p);
    size_t last = size / sizeof(uint64_t) - 1;
    if (zero && (words[0] != 0 || words[last] != 0)) failures->fetch_add(1);
    if (asked_zero && !zero) failures->fetch_add(1);  // asked for zeroes: must get them
    words[0] = Word(a, 0);
    words[last] = Word(a, last);

    rdmalloc_keys k;
    int rc = heap.Lookup(p, size, nullptr, &k);
    EXPECT_EQ(rc, RDMALLOC_OK);
    if (rc == RDMALLOC_OK) {
      ExpectCovers(k, a, size);
      if (dma) {
        // Through the registration, as a peer's NIC would: allowed exactly
        // when the access class grants it; the CPU sees what was written.
        uint64_t v = Word(a, 1);
        int wrote = heap.Dma(&k, sizeof(uint64_t), &v, sizeof v, /*to_memory=*/true);
        if (access_class & RDMALLOC_REMOTE_WRITE) {
          EXPECT_EQ(wrote, RDMALLOC_OK);
          EXPECT_EQ(words[1], v);
        } else {
          EXPECT_NE(wrote, RDMALLOC_OK);
          EXPECT_NE(words[1], v);
        }
        uint64_t back = 0;
        int read = heap.Dma(&k, 0, &back, sizeof back, /*to_memory=*/false);
        if (access_class & RDMALLOC_REMOTE_READ) {
          EXPECT_EQ(read, RDMALLOC_OK);
          EXPECT_EQ(back, Word(a, 0));
        } else {
          EXPECT_NE(read, RDMALLOC_OK);
        }
      }
    }
    slot.size.store(size, std::memory_order_relaxed);
    slot.addr.store(a, std::memory_order_relaxed);

    // Someone else's extent, which its owner may be releasing right now: any
    // answer is allowed except a crash or keys that do not cover it.
    Published& other = table[rng() % (kThreads * kSlotsPerThread)];
    uintptr_t oa = other.addr.load(std::memory_order_relaxed);
    if (oa != 0 && heap.Lookup(reinterpret_cast<void*>(oa), 1, nullptr, &k) == RDMALLOC_OK)
      ExpectCovers(k, oa, 1);
  }
  for (int i = 0; i < kSlotsPerThread; i++) {
    uintptr_t a = mine[i].addr.exchange(0);
    if (a == 0) continue;
    size_t size = mine[i].size.load();
    Region* r = heap.RegionOf(reinterpret_cast<void*>(a), size);
    ASSERT_NE(r, nullptr);
    heap.FreeExtent(r, reinterpret_cast<void*>(a), size, rdmalloc::Heap::Freed::kWarm,
                   heap.HeldBlock(r, reinterpret_cast<void*>(a), size));
  }
}

TEST(HeapThreads, ExtentsLookupsAndReleasesRace) {
  Heap& heap = StartedHeap();
  std::vector<Published> table(kThreads * kSlotsPerThread);
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < kThreads; i++)
    threads.emplace_back(Worker, std::ref(heap), i, 400, table.data(), &failures);
  // Readers of heap-wide state while it changes (for TSan: the counters are
  // read without a lock, so their sums only agree once the heap is quiet).
  std::atomic<bool> stop{false};
  std::thread observer([&] {
    FILE* devnull = fopen("/dev/null", "w");
    ASSERT_NE(devnull, nullptr);
    while (!stop.load()) {
      struct rdmalloc_stats s;
      ASSERT_EQ(heap.Stats(&s, sizeof s), RDMALLOC_OK);
      heap.DumpRegions(devnull);
    }
    fclose(devnull);
  });
  for (std::thread& t : threads) t.join();
  stop.store(true);
  observer.join();
  EXPECT_EQ(failures.load(), 0);
  ExpectEmpty(heap);
}

// The program's memory registrations hold regions (Heap::HoldRange, as the
// interposer does for an MR) while threads free, release, shed and trim: a
// held region stays findable after its extent is freed, until the last hold
// goes; then it may go, and at the end every region is gone. With
// RDMALLOC_RETAIN=0 (heap_threads_noretain_test) every emptied region is
// released at once, so holds race with release decisions all the time.
TEST(HeapThreads, HeldRegionsOutliveTheirExtentsAndGoWithTheLastHold) {
  Heap& heap = StartedHeap();
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; t++) {
    threads.emplace_back([&, t] {
      std::mt19937_64 rng(500 + t);
      for (int i = 0; i < 300 && failures.load() == 0; i++) {
        size_t size = PickPages(rng) << kPageShift;
        bool zero = false;
        // Two arenas for four threads: threads share regions and their holds.
        void* p = heap.AllocExtent(static_cast<unsigned>(t % 2), 0, nullptr, size, kPageSize, &zero);
        if (p == nullptr) {
          ADD_FAILURE() << "no extent";
          failures.fetch_add(1);
          return;
        }
        Region* held[8];
        size_t n = heap.HoldRange(p, size, held, 8);
        Region* r = heap.RegionOf(p, size);
        if (n == 0 || r == nullptr) {
          ADD_FAILURE() << "no hold on a live extent";
          failures.fetch_add(1);
          return;
        }
        heap.FreeExtent(r, p, size, rdmalloc::Heap::Freed::kWarm, heap.HeldBlock(r, p, size));
        if (rng() % 4 == 0) heap.GiveBackRetained();  // sheds and purges, as malloc_trim
        if (heap.RegionOf(p, 1) != r) {
          ADD_FAILURE() << "a region under a hold was released";
          failures.fetch_add(1);
        }
        for (size_t j = 0; j < n; j++) heap.DropHold(held[j]);
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(failures.load(), 0);
  ExpectEmpty(heap);
}

// Domains come and go while threads look up their extents under them: every
// lookup under an open domain covers the extent; removal deregisters all.
TEST(HeapThreads, DomainsAddedAndRemovedUnderLookups) {
  Heap& heap = StartedHeap();
  if (!UringBackend()) GTEST_SKIP() << "domains need real pds on verbs; covered on uring";
  static int token;
  auto* pd = reinterpret_cast<ibv_pd*>(&token);
  std::atomic<int> running{2};
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 2; t++) {
    threads.emplace_back([&, t] {
      std::mt19937_64 rng(7 + t);
      for (int i = 0; i < 300; i++) {
        size_t size = PickPages(rng) << kPageShift;
        bool zero = false;
        void* p = heap.AllocExtent(static_cast<unsigned>(t), 0, nullptr, size, kPageSize, &zero);
        if (p == nullptr) {
          failures.fetch_add(1);
          break;
        }
        rdmalloc_keys k;
        int rc = heap.Lookup(p, size, pd, &k);
        // Not open at this moment (EINVAL), or closed while registering
        // (registration fails with ENODEV).
        if (rc == RDMALLOC_OK) {
          ExpectCovers(k, reinterpret_cast<uintptr_t>(p), size);
        } else if (rc != RDMALLOC_EINVAL && !(rc == RDMALLOC_EREGFAIL && k.reg_errno == ENODEV)) {
          ADD_FAILURE() << "lookup under a domain coming and going: " << rc;
        }
        Region* r = heap.RegionOf(p, size);
        heap.FreeExtent(r, p, size, rdmalloc::Heap::Freed::kWarm, heap.HeldBlock(r, p, size));
      }
      running.fetch_sub(1);
    });
  }
  for (int toggles = 0; toggles < 20 || running.load() > 0; toggles++) {
    ASSERT_EQ(heap.AddDomain(pd, RDMALLOC_ACCESS_LOCAL_WRITE), RDMALLOC_OK);
    std::this_thread::yield();
    ASSERT_EQ(heap.RemoveDomain(pd), RDMALLOC_OK);
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(failures.load(), 0);
  ExpectEmpty(heap);
}

}  // namespace
}  // namespace rdmalloc
