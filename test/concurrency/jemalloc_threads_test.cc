// jemalloc on rdmalloc's extent hooks, driven from several threads through
// its renamed entry points (rdmj_*), while the process keeps its own malloc.
// Under --config=tsan that malloc is TSan's: jemalloc itself is not
// instrumented (TSan sees its pthread mutexes, not its atomics), but every
// hook call into the heap is, with jemalloc choosing when extents are made,
// split, cached, purged and given back: threads allocate, free each other's
// blocks, reallocate, look blocks up, flush their caches and purge arenas,
// in the plain heap and in an access-class arena.
#include <gtest/gtest.h>
#include <jemalloc/jemalloc.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "allocator/config.h"
#include "allocator/extent_hooks.h"
#include "allocator/heap.h"
#include "allocator/jemalloc_api.h"

namespace rdmalloc {
namespace {

constexpr int kThreads = 4;
constexpr int kSlots = 16;
constexpr int kShared = 32;

void IgnoreWarning(const char*) {}
const char* GetEnv(const char* name) { return getenv(name); }

}  // namespace
}  // namespace rdmalloc

// jemalloc's calls into rdmalloc's start-up and access classes
// (third_party/jemalloc_rdmalloc.patch), which allocator/malloc_override.cc
// answers in the allocator. Here the test starts the heap itself (StartedHeap)
// before its threads allocate, and frees class memory with explicit flags.
extern "C" {
int rdmj_init_state = 2;  // ready
void rdmj_start() {}
unsigned rdmj_access_class(const void*) { return 0; }
// Never called: rdmj_access_class() sees no class block.
void* rdmj_class_realloc(void*, size_t, unsigned) { abort(); }
}

namespace rdmalloc {
namespace {

// What malloc's first call does in allocator/malloc_override.cc.
Heap& StartedHeap() {
  static bool started = [] {
    TheHeap().Configure(ParseConfig(GetEnv, IgnoreWarning));
    InstallExtentHooks();
    TheHeap().Start();
    return true;
  }();
  (void)started;
  return TheHeap();
}

struct Block {
  uint8_t* p = nullptr;
  size_t size = 0;
  bool class_memory = false;
};

uint8_t Mark(const Block& b, size_t i) {
  return static_cast<uint8_t>((reinterpret_cast<uintptr_t>(b.p) >> 4) + i * 7);
}

void Fill(const Block& b) {
  b.p[0] = Mark(b, 0);
  b.p[b.size - 1] = Mark(b, b.size - 1);
}

bool Intact(const Block& b) {
  return b.p[0] == Mark(b, 0) && b.p[b.size - 1] == Mark(b, b.size - 1);
}

size_t PickSize(std::mt19937_64& rng) {
  switch (rng() % 20) {
    case 0: return (size_t{2} << 20) + rng() % (size_t{1} << 20);  // a region of its own
    case 1: case 2: case 3: case 4: return 4096 + rng() % 65536;
    default: return 1 + rng() % 1024;
  }
}

void Free(const Block& b) {
  if (b.class_memory) {
    rdmj_dallocx(b.p, MALLOCX_TCACHE_NONE);
  } else {
    rdmj_free(b.p);
  }
}

TEST(JemallocThreads, HooksUnderAllocationFreeAndPurgeFromManyThreads) {
  Heap& heap = StartedHeap();
  // Remote-readable class memory: an arena of its own, never cached per thread.
  unsigned class_arena = ClassArena(RDMALLOC_REMOTE_READ);
  ASSERT_NE(class_arena, 0u);
  std::vector<std::atomic<Block*>> shared(kShared);
  for (auto& s : shared) s.store(nullptr);
  std::atomic<int> failures{0};
  std::atomic<int> with_arena{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; t++) {
    threads.emplace_back([&, t] {
      // A thread's first malloc makes its automatic arena, publishing it
      // with jemalloc's atomics, which TSan does not see: a purge of every
      // arena meanwhile read as a race on the new arena's mutexes. Every
      // arena is made before any thread purges.
      rdmj_free(rdmj_malloc(1));
      with_arena.fetch_add(1);
      while (with_arena.load() < kThreads) std::this_thread::yield();
      std::mt19937_64 rng(31 + t);
      Block mine[kSlots];
      for (int round = 0; round < 3000; round++) {
        Block& b = mine[rng() % kSlots];
        if (b.p != nullptr) {
          if (!Intact(b)) failures.fetch_add(1);
          unsigned action = rng() % 3;
          if (action == 0) {
            // Hand it to whichever thread takes that shared slot next.
            Block* old = shared[rng() % kShared].exchange(new Block(b));
            if (old != nullptr) {
              if (!Intact(*old)) failures.fetch_add(1);
              Free(*old);
              delete old;
            }
          } else if (action == 1 && !b.class_memory) {
            size_t size = PickSize(rng);
            b.p = static_cast<uint8_t*>(rdmj_realloc(b.p, size));
            if (b.p == nullptr) {
              failures.fetch_add(1);
              b = Block();
              continue;
            }
            b.size = size;
            Fill(b);
            continue;
          } else {
            Free(b);
          }
          b = Block();
          continue;
        }
        b.size = PickSize(rng);
        b.class_memory = rng() % 8 == 0;
        b.p = static_cast<uint8_t*>(
            b.class_memory ? rdmj_mallocx(b.size, MALLOCX_ARENA(class_arena) | MALLOCX_TCACHE_NONE)
                           : rdmj_malloc(b.size));
        if (b.p == nullptr) {
          failures.fetch_add(1);
          b = Block();
          continue;
        }
        Fill(b);
        rdmalloc_keys k;
        int rc = heap.Lookup(b.p, b.size, nullptr, &k);
        if (rc != RDMALLOC_OK) {
          ADD_FAILURE() << "lookup of a live block: " << rc;
        } else {
          uintptr_t base = reinterpret_cast<uintptr_t>(k.region_base);
          uintptr_t a = reinterpret_cast<uintptr_t>(b.p);
          EXPECT_TRUE(base <= a && a - base + b.size <= k.region_len);
          EXPECT_EQ((k.access & RDMALLOC_ACCESS_REMOTE_READ) != 0, b.class_memory);
        }
        if (round % 500 == 499) {
          // Cached extents go back through the hooks while others allocate.
          rdmj_mallctl("thread.tcache.flush", nullptr, nullptr, nullptr, 0);
          if (t == 0) rdmj_mallctl("arena.4096.purge", nullptr, nullptr, nullptr, 0);
        }
      }
      for (Block& b : mine) {
        if (b.p == nullptr) continue;
        if (!Intact(b)) failures.fetch_add(1);
        Free(b);
      }
    });
  }
  for (std::thread& t : threads) t.join();
  for (auto& s : shared) {
    if (Block* b = s.exchange(nullptr)) {
      EXPECT_TRUE(Intact(*b));
      Free(*b);
      delete b;
    }
  }
  EXPECT_EQ(failures.load(), 0);
  rdmj_mallctl("thread.tcache.flush", nullptr, nullptr, nullptr, 0);
  rdmj_mallctl("arena.4096.purge", nullptr, nullptr, nullptr, 0);
  heap.GiveBackRetained();  // what the mallctl guard adds to a purge: kept regions go too
  struct rdmalloc_stats s;
  ASSERT_EQ(heap.Stats(&s, sizeof s), RDMALLOC_OK);
  EXPECT_LE(s.bytes_in_use, s.bytes_mapped);
  EXPECT_LE(s.bytes_pinned, s.bytes_mapped);
  EXPECT_EQ(s.regions_live, s.regions_created - s.regions_released);
  EXPECT_GT(s.regions_released, 0u);  // purging gave whole regions back
}

}  // namespace
}  // namespace rdmalloc
