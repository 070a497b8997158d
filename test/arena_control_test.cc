// The mallctl guard (allocator/arena_control.h): every control path into
// jemalloc ends in the same check. By name or by MIB, a new arena without
// hooks of the caller's own runs on rdmalloc's hooks (its memory is
// registered heap), and rdmalloc's hooks cannot be replaced on a live arena;
// arenas made with the caller's own hooks stay the caller's.
#include <errno.h>
#include <jemalloc/jemalloc.h>
#include <sys/mman.h>

#include <cstdint>
#include <cstdio>
#include <cstring>

#include <gtest/gtest.h>

#include "allocator/rdmalloc.h"
#include "test/test_util.h"

namespace {

extent_hooks_t* HooksOf(unsigned arena) {
  char name[64];
  snprintf(name, sizeof name, "arena.%u.extent_hooks", arena);
  extent_hooks_t* hooks = nullptr;
  size_t len = sizeof hooks;
  EXPECT_EQ(mallctl(name, &hooks, &len, nullptr, 0), 0) << name;
  return hooks;
}

extent_hooks_t* Rdmallocs() { return HooksOf(0); }

// Keys for a fresh block from `arena`: RDMALLOC_OK when it is registered heap.
int LookupInArena(unsigned arena) {
  void* p = mallocx(4096, MALLOCX_ARENA(arena) | MALLOCX_TCACHE_NONE);
  EXPECT_NE(p, nullptr);
  memset(p, 1, 4096);
  rdmalloc_keys k;
  int rc = rdmalloc_lookup(p, 4096, nullptr, &k);
  dallocx(p, MALLOCX_TCACHE_NONE);
  return rc;
}

// Minimal hooks of "the caller's own": plain mmap, never registered.
void* OwnAlloc(extent_hooks_t*, void* new_addr, size_t size, size_t alignment, bool* zero,
               bool* commit, unsigned) {
  if (new_addr != nullptr) return nullptr;
  size_t span = size + alignment;
  void* raw = mmap(nullptr, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (raw == MAP_FAILED) return nullptr;
  uintptr_t start = reinterpret_cast<uintptr_t>(raw);
  uintptr_t aligned = (start + alignment - 1) & ~(uintptr_t(alignment) - 1);
  if (aligned > start) munmap(raw, aligned - start);
  if (start + span > aligned + size)
    munmap(reinterpret_cast<void*>(aligned + size), start + span - aligned - size);
  *zero = true;
  *commit = true;
  return reinterpret_cast<void*>(aligned);
}
bool OwnDalloc(extent_hooks_t*, void* addr, size_t size, bool, unsigned) {
  return munmap(addr, size) != 0;
}
extent_hooks_t g_own = {OwnAlloc, OwnDalloc, nullptr, nullptr, nullptr,
                        nullptr,  nullptr,   nullptr, nullptr};

unsigned CreateByName(extent_hooks_t* hooks) {
  unsigned ind = 0;
  size_t len = sizeof ind;
  EXPECT_EQ(mallctl("arenas.create", &ind, &len, hooks != nullptr ? &hooks : nullptr,
                    hooks != nullptr ? sizeof hooks : 0),
            0);
  return ind;
}

unsigned CreateByMib() {
  size_t mib[4];
  size_t miblen = 4;
  EXPECT_EQ(mallctlnametomib("arenas.create", mib, &miblen), 0);
  unsigned ind = 0;
  size_t len = sizeof ind;
  EXPECT_EQ(mallctlbymib(mib, miblen, &ind, &len, nullptr, 0), 0);
  return ind;
}

int SetHooksByName(unsigned arena, extent_hooks_t* hooks) {
  char name[64];
  snprintf(name, sizeof name, "arena.%u.extent_hooks", arena);
  return mallctl(name, nullptr, nullptr, &hooks, sizeof hooks);
}

int SetHooksByMib(unsigned arena, extent_hooks_t* hooks) {
  size_t mib[4];
  size_t miblen = 4;
  EXPECT_EQ(mallctlnametomib("arena.0.extent_hooks", mib, &miblen), 0);
  mib[1] = arena;
  return mallctlbymib(mib, miblen, nullptr, nullptr, &hooks, sizeof hooks);
}

// Every automatic arena, arena 0 and those jemalloc makes later alike, runs
// on rdmalloc's hooks from birth (no start-up mallctl checks it any more):
// its memory is registered heap, and all share one set of hooks.
TEST(ArenaControl, EveryAutomaticArenaRunsOnRdmallocsHooks) {
  unsigned narenas = 0;
  size_t len = sizeof narenas;
  ASSERT_EQ(mallctl("opt.narenas", &narenas, &len, nullptr, 0), 0);
  ASSERT_GE(narenas, 1u);
  for (unsigned i = 0; i < narenas; i++) {
    EXPECT_EQ(LookupInArena(i), RDMALLOC_OK) << "arena " << i;
    EXPECT_NE(HooksOf(i), nullptr);
    EXPECT_EQ(HooksOf(i), Rdmallocs()) << "arena " << i;
  }
}

TEST(ArenaControl, ArenasCreateWithoutHooksGetsRdmallocsByNameAndByMib) {
  unsigned by_name = CreateByName(nullptr);
  unsigned by_mib = CreateByMib();
  ASSERT_NE(by_name, 0u);
  ASSERT_NE(by_mib, 0u);
  EXPECT_EQ(HooksOf(by_name), Rdmallocs());
  EXPECT_EQ(HooksOf(by_mib), Rdmallocs()) << "arenas.create by MIB escaped the hooks";
  EXPECT_EQ(LookupInArena(by_name), RDMALLOC_OK);
  EXPECT_EQ(LookupInArena(by_mib), RDMALLOC_OK) << "memory of a MIB-made arena is not ours";
}

TEST(ArenaControl, ArenasCreateExtWithoutHooksGetsRdmallocs) {
  struct {
    extent_hooks_t* extent_hooks;
    bool metadata_use_hooks;
  } config = {nullptr, true};
  unsigned ind = 0;
  size_t len = sizeof ind;
  ASSERT_EQ(mallctl("experimental.arenas_create_ext", &ind, &len, &config, sizeof config), 0);
  EXPECT_EQ(HooksOf(ind), Rdmallocs());
  EXPECT_EQ(LookupInArena(ind), RDMALLOC_OK);
}

TEST(ArenaControl, RdmallocsHooksCannotBeReplacedByNameOrMib) {
  unsigned made = CreateByMib();
  unsigned class_arena = 0;
  void* c = rdmalloc_alloc(100, RDMALLOC_REMOTE_READ);
  ASSERT_NE(c, nullptr);
  size_t len = sizeof class_arena;
  ASSERT_EQ(mallctl("arenas.lookup", &class_arena, &len, &c, sizeof c), 0);
  ASSERT_NE(class_arena, 0u);
  unsigned narenas = 0;
  len = sizeof narenas;
  ASSERT_EQ(mallctl("opt.narenas", &narenas, &len, nullptr, 0), 0);
  for (unsigned arena : {0u, made, class_arena}) {
    extent_hooks_t* before = HooksOf(arena);
    ASSERT_EQ(before, Rdmallocs()) << "arena " << arena;
    EXPECT_EQ(SetHooksByName(arena, &g_own), EPERM) << "arena " << arena << " by name";
    EXPECT_EQ(SetHooksByMib(arena, &g_own), EPERM) << "arena " << arena << " by MIB";
    EXPECT_EQ(HooksOf(arena), before) << "arena " << arena << ": hooks replaced";
  }
  EXPECT_EQ(LookupInArena(0), RDMALLOC_OK);
  // The last automatic arena, which jemalloc makes only when a thread needs
  // it: writing its hooks would make it with the caller's. It is rdmalloc's.
  unsigned last = narenas - 1;
  EXPECT_EQ(SetHooksByName(last, &g_own), EPERM) << "automatic arena " << last << " by name";
  EXPECT_EQ(SetHooksByMib(last, &g_own), EPERM) << "automatic arena " << last << " by MIB";
  EXPECT_EQ(LookupInArena(last), RDMALLOC_OK) << "automatic arena " << last << " is not ours";
  EXPECT_EQ(HooksOf(last), Rdmallocs());
  free(c);
}

TEST(ArenaControl, ArenasMadeWithTheCallersHooksStayTheCallers) {
  unsigned own = CreateByName(&g_own);
  ASSERT_NE(own, 0u);
  EXPECT_EQ(HooksOf(own), &g_own);
  EXPECT_EQ(LookupInArena(own), RDMALLOC_ENOTOURS) << "not registered: the caller's memory";
  EXPECT_EQ(SetHooksByMib(own, &g_own), 0) << "the caller may change its own arena's hooks";
  char name[64];
  snprintf(name, sizeof name, "arena.%u.destroy", own);
  EXPECT_EQ(mallctl(name, nullptr, nullptr, nullptr, 0), 0);
}

TEST(ArenaControl, ClassArenasCannotBeDestroyedOrResetButTheCallersCan) {
  void* c = rdmalloc_alloc(100, RDMALLOC_REMOTE_WRITE);
  ASSERT_NE(c, nullptr);
  unsigned class_arena = 0;
  size_t len = sizeof class_arena;
  ASSERT_EQ(mallctl("arenas.lookup", &class_arena, &len, &c, sizeof c), 0);
  char name[64];
  snprintf(name, sizeof name, "arena.%u.destroy", class_arena);
  EXPECT_EQ(mallctl(name, nullptr, nullptr, nullptr, 0), EPERM);
  snprintf(name, sizeof name, "arena.%u.reset", class_arena);
  EXPECT_EQ(mallctl(name, nullptr, nullptr, nullptr, 0), EPERM);
  memset(c, 2, 100);  // still ours
  free(c);
  unsigned made = CreateByMib();
  snprintf(name, sizeof name, "arena.%u.destroy", made);
  EXPECT_EQ(mallctl(name, nullptr, nullptr, nullptr, 0), 0);
}

// rdmalloc's merge hook (allocator/extent_hooks.cc), called as jemalloc
// would: one extent never spans two regions, nor a region and foreign
// memory, whichever way the extents meet (inside a chunk, or where a chunk
// and maybe a region ends). false: jemalloc may merge.
TEST(ExtentHooks, MergeJoinsExtentsOfOneRegionOnly) {
  extent_hooks_t* h = Rdmallocs();
  ASSERT_NE(h, nullptr);
  ASSERT_NE(h->merge, nullptr);
  constexpr size_t kPage = 4096, kChunk = size_t{2} << 20;
  auto merge = [&](uintptr_t a, uintptr_t b) {
    return h->merge(h, reinterpret_cast<void*>(a), b - a, reinterpret_cast<void*>(b), kPage, true, 0);
  };
  void* p = malloc(3 << 20);
  void* q = malloc(3 << 20);
  ASSERT_NE(p, nullptr);
  ASSERT_NE(q, nullptr);
  rdmalloc_keys kp, kq;
  ASSERT_EQ(rdmalloc_lookup(p, 1, nullptr, &kp), RDMALLOC_OK);
  ASSERT_EQ(rdmalloc_lookup(q, 1, nullptr, &kq), RDMALLOC_OK);
  const uintptr_t base = reinterpret_cast<uintptr_t>(kp.region_base);
  const uintptr_t end = base + kp.region_len;
  ASSERT_GE(kp.region_len, 2 * kChunk) << "the premise: a region of two chunks or more";

  EXPECT_FALSE(merge(base, base + kPage)) << "inside one chunk of one region";
  EXPECT_FALSE(merge(base + kChunk - kPage, base + kChunk)) << "across a chunk, one region";
  EXPECT_FALSE(merge(base, end - kPage)) << "the whole region";
  EXPECT_TRUE(merge(end - kPage, end)) << "the region's end and what follows it";
  EXPECT_TRUE(merge(base - kPage, base)) << "what precedes the region and its start";
  if (kq.region_base != kp.region_base) {
    const uintptr_t other = reinterpret_cast<uintptr_t>(kq.region_base);
    EXPECT_TRUE(h->merge(h, reinterpret_cast<void*>(end - kPage), kPage,
                         reinterpret_cast<void*>(other), kPage, true, 0))
        << "two regions";
  }
  // Foreign memory (the default hooks decide): two pages of a mapping of ours.
  void* m = mmap(nullptr, 2 * kChunk, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(m, MAP_FAILED);
  const uintptr_t f = (reinterpret_cast<uintptr_t>(m) + kChunk - 1) & ~(kChunk - 1);
  EXPECT_FALSE(merge(f, f + kPage)) << "foreign, inside a chunk";
  EXPECT_FALSE(merge(f + kChunk - kPage, f + kChunk)) << "foreign, across a chunk";
  EXPECT_TRUE(h->merge(h, reinterpret_cast<void*>(f), kPage, reinterpret_cast<void*>(base), kPage,
                       true, 0))
      << "foreign and a region";
  munmap(m, 2 * kChunk);
  free(p);
  free(q);
}

}  // namespace
