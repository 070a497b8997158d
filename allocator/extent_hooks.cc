#include "allocator/extent_hooks.h"

#include <jemalloc/jemalloc.h>

#include <sys/types.h>

#include <cstdio>

#include "allocator/arena_control.h"
#include "allocator/fork.h"
#include "allocator/heap.h"
#include "allocator/log.h"
#include "allocator/jemalloc_api.h"
#include "allocator/lock_order.h"
#include "allocator/mutex.h"
#include "allocator/startup_data.h"

namespace rdmalloc {

RDMALLOC_STARTUP_DATA std::atomic<bool> g_classes_in_use{false};

// The merge hook's answer (true: refused), which jemalloc asks for this
// table directly (the patch's ehooks_merge: no load of the hook, no
// indirect call, no argument unused) when MergeAsked; it answers false
// itself for the rest.
bool MergeRefused(void* addr_a, size_t size_a, void* addr_b, size_t size_b) __asm__("rdmj_merge")
    __attribute__((visibility("hidden")));

namespace {

// MALLOCX_ARENA encodes up to 4095 arenas.
constexpr unsigned kMaxArenas = 4096;
std::atomic<uint8_t> g_arena_class[kMaxArenas];
RDMALLOC_STARTUP_DATA std::atomic<unsigned> g_class_arena[kAccessClasses];
RDMALLOC_STARTUP_DATA Mutex<LockRank::kClassArenas> g_class_lock;

// Until a class arena exists (ClassArena sets its entry first), every arena
// is the plain heap's, and the table's page is never touched.
unsigned ClassOfArena(unsigned arena_ind) {
  if (!g_classes_in_use.load(std::memory_order_acquire) || arena_ind >= kMaxArenas) return 0;
  return g_arena_class[arena_ind].load(std::memory_order_acquire);
}

// jemalloc's own hooks: for memory that is not in a region of ours (made when
// no region could be).
extent_hooks_t* const g_default = const_cast<extent_hooks_t*>(&je_ehooks_default_extent_hooks);

void* Alloc(extent_hooks_t*, void* new_addr, size_t size, size_t alignment, bool* zero,
            bool* commit, unsigned arena_ind) {
  HookScope in_jemalloc;
  unsigned c = ClassOfArena(arena_ind);
  Log(3, "extent alloc %zu bytes, alignment %zu, arena %u: access class %u", size,
                alignment, arena_ind, c);
  if (void* p = TheHeap().AllocExtent(arena_ind, c, new_addr, size, alignment, zero)) {
    *commit = true;  // regions are always committed: pages may be pinned
    return p;
  }
  if (new_addr != nullptr) return nullptr;  // growth in place is just not possible here
  // Class memory must be registered with its rights, or not exist.
  if (c != 0) return nullptr;
  // No region could be made (address space or descriptors exhausted): hand out
  // unregistered memory rather than fail the allocation. Lookups report it.
  // mmap'd, whatever the arena's dss setting: jemalloc merges two foreign
  // extents that meet inside a chunk without asking (MergeAsked), as its
  // default hooks allow for mappings, not across the end of its dss.
  void* p = je_extent_alloc_mmap(nullptr, size, alignment, zero, commit);
  if (p != nullptr) TheHeap().CountForeign();
  return p;
}

// Whether jemalloc keeps freed extents dirty for a decay time before it
// gives them back (RDMALLOC_DECAY_MS, else MALLOC_CONF's dirty_decay_ms).
std::atomic<bool> g_jemalloc_decays{true};

// An extent of smaller blocks only comes back when jemalloc's decay lets it
// go, past kLargeReturnedAtOnce (MergeRefused keeps jemalloc from coalescing
// them that far, but an arena's end gives back anything), or when a purge
// asks for it: cold, as stock jemalloc purges it (kept, they raised mstress's
// peak RSS to 1.09x jemalloc's). An extent that holds a large block comes
// back as soon as that block is freed: warm, the next one reuses its pages.
// With no decay time every freed extent comes back at once: warm.
Heap::Freed HowFreed(PageMap::Block held) {
  if (!g_jemalloc_decays.load(std::memory_order_relaxed)) return Heap::Freed::kWarm;
  return held != PageMap::Block::kSmall ? Heap::Freed::kWarm : Heap::Freed::kCold;
}

void Free(Region* r, void* addr, size_t size, unsigned arena_ind) {
  PageMap::Block held = TheHeap().HeldBlock(r, addr, size);
  Heap::Freed how = HowFreed(held);
  Log(3, "extent freed: %zu bytes, arena %u (%s)", size, arena_ind,
      how == Heap::Freed::kCold ? "cold" : "warm");
  TheHeap().FreeExtent(r, addr, size, how, held);
}

// Accept: the pages go back to the heap, which keeps them registered (or
// releases the whole region once it is empty).
bool Dalloc(extent_hooks_t*, void* addr, size_t size, bool committed, unsigned arena_ind) {
  HookScope in_jemalloc;
  if (Region* r = TheHeap().RegionOf(addr, size)) {
    Free(r, addr, size, arena_ind);
    return false;
  }
  return g_default->dalloc(g_default, addr, size, committed, arena_ind);
}

void Destroy(extent_hooks_t*, void* addr, size_t size, bool committed, unsigned arena_ind) {
  HookScope in_jemalloc;
  if (Region* r = TheHeap().RegionOf(addr, size)) {
    Free(r, addr, size, arena_ind);
    return;
  }
  g_default->destroy(g_default, addr, size, committed, arena_ind);
}

bool Commit(extent_hooks_t*, void* addr, size_t size, size_t offset, size_t length,
            unsigned arena_ind) {
  if (TheHeap().RegionOf(addr, size) != nullptr) return false;  // never decommitted
  return g_default->commit(g_default, addr, size, offset, length, arena_ind);
}

// Refuse: decommitting or purging would give the CPU a new page while an MR
// may still point at the old one. jemalloc then falls back to dalloc.
bool Decommit(extent_hooks_t*, void* addr, size_t size, size_t offset, size_t length,
              unsigned arena_ind) {
  if (TheHeap().RegionOf(addr, size) != nullptr) return true;
  return g_default->decommit(g_default, addr, size, offset, length, arena_ind);
}

bool PurgeLazy(extent_hooks_t*, void* addr, size_t size, size_t offset, size_t length,
               unsigned arena_ind) {
  if (TheHeap().RegionOf(addr, size) != nullptr || g_default->purge_lazy == nullptr) return true;
  return g_default->purge_lazy(g_default, addr, size, offset, length, arena_ind);
}

bool PurgeForced(extent_hooks_t*, void* addr, size_t size, size_t offset, size_t length,
                 unsigned arena_ind) {
  if (TheHeap().RegionOf(addr, size) != nullptr || g_default->purge_forced == nullptr)
    return true;
  return g_default->purge_forced(g_default, addr, size, offset, length, arena_ind);
}

// Split and merge are the hooks jemalloc calls most. MergeRefused runs
// without the reentrancy guard (see g_hooks): it calls nothing that
// allocates.
//
// Every split is allowed, with no lookup: inside a region it is jemalloc's
// bookkeeping, and jemalloc's default hooks, which own any extent outside
// the regions, allow every split where mappings coalesce (Linux). jemalloc,
// patched, answers so itself for this table without the call; the hook
// stays for whoever reads the table (arena.<i>.extent_hooks) and calls it.
bool Split(extent_hooks_t*, void*, size_t, size_t, size_t, bool, unsigned) { return false; }

// Whether jemalloc asks MergeRefused (the patch's ehooks_merge makes the same
// two comparisons). Regions own whole chunks, so extents that meet inside a
// chunk are of one region, or both foreign: an extent may span two regions,
// or a region and foreign memory, only where b starts a chunk. Smaller than
// kSmallBlocksCoalesceBelow together, such extents merge.
bool MergeAsked(const void* addr_b, size_t size_a, size_t size_b) {
  return (reinterpret_cast<uintptr_t>(addr_b) & (kChunkSize - 1)) == 0 ||
         size_a + size_b >= kSmallBlocksCoalesceBelow;
}

bool Merge(extent_hooks_t*, void* addr_a, size_t size_a, void* addr_b, size_t size_b, bool,
           unsigned) {
  return MergeAsked(addr_b, size_a, size_b) && MergeRefused(addr_a, size_a, addr_b, size_b);
}

}  // namespace

// Never let an extent span two regions, or a region and foreign memory: one
// allocation must have one MR. Foreign extents are mmap'd (Alloc), and
// jemalloc's default hooks merge any two mappings (they coalesce here).
//
// Freed small blocks coalesce to less than kSmallBlocksCoalesceBelow, as
// stock jemalloc's stop at its mappings' edges (it never merges across two):
// larger, jemalloc would not split them for its slabs, and from
// kLargeReturnedAtOnce it would purge them at once, pages it would otherwise
// reuse (mstress at two threads purged 2.8x the bytes of stock jemalloc). A
// merge with a large block goes ahead: that extent comes back warm and is
// kept (HowFreed).
bool MergeRefused(void* addr_a, size_t size_a, void* addr_b, size_t size_b) {
  HookScope in_jemalloc;
  Region* r = TheHeap().RegionOf(addr_a, size_a);
  if ((reinterpret_cast<uintptr_t>(addr_b) & (kChunkSize - 1)) == 0 &&
      TheHeap().RegionOf(addr_b, size_b) != r)
    return true;
  if (r == nullptr || size_a + size_b < kSmallBlocksCoalesceBelow) return false;
  return g_jemalloc_decays.load(std::memory_order_relaxed) &&
         TheHeap().HeldBlock(r, addr_a, size_a + size_b) == PageMap::Block::kSmall;
}

// Named for jemalloc, which answers for this table's split hook and most
// merges itself, and calls MergeRefused for the rest without its reentrancy
// guard (third_party/jemalloc_rdmalloc.patch, ehooks.h): that guard's two
// tsd_slow_update() calls cost more than the hooks themselves.
extent_hooks_t g_hooks __asm__("rdmj_extent_hooks") __attribute__((visibility("hidden"))) = {
    Alloc, Dalloc, Destroy, Commit, Decommit, PurgeLazy, PurgeForced, Split, Merge};

unsigned ClassArena(unsigned access_class) {
  if (access_class == 0 || access_class >= kAccessClasses) return 0;
  unsigned a = g_class_arena[access_class].load(std::memory_order_acquire);
  if (a != 0) return a;
  LockGuard g(g_class_lock);
  a = g_class_arena[access_class].load(std::memory_order_relaxed);
  if (a != 0) return a;
  unsigned ind = CreateArena(&g_hooks, /*internal=*/true);
  if (ind == 0 || ind >= kMaxArenas) return 0;
  g_arena_class[ind].store(static_cast<uint8_t>(access_class), std::memory_order_release);
  g_classes_in_use.store(true, std::memory_order_seq_cst);
  rdmj_recompute_fast_paths();
  g_class_arena[access_class].store(ind, std::memory_order_release);
  return ind;
}

void InstallExtentHooks() {
  // Every arena, arena 0 included, is made with rdmj_arena_config (below), so
  // there is nothing to install; no mallctl here, which would build
  // jemalloc's control tree at every start (//test:arena_control_test checks
  // the hooks of every arena). From here on every control path goes through
  // the guard.
  InitArenaControl(&g_hooks, g_default, [] { TheHeap().GiveBackRetained(); });
  ForkHandlers fork;
  fork.prepare = [] { g_class_lock.Lock(); };
  fork.parent = [] { g_class_lock.Unlock(); };
  fork.child = [] { g_class_lock.ResetAfterFork(); };
  SetForkHandlers(LockRank::kClassArenas, fork);
}

void SetDirtyDecay(long ms) {
  ssize_t value = ms;
  rdmj_mallctl("arenas.dirty_decay_ms", nullptr, nullptr, &value, sizeof value);
  unsigned narenas = 0;
  size_t len = sizeof narenas;
  rdmj_mallctl("arenas.narenas", &narenas, &len, nullptr, 0);
  for (unsigned i = 0; i < narenas; i++) {
    char name[64];
    snprintf(name, sizeof name, "arena.%u.dirty_decay_ms", i);
    rdmj_mallctl(name, nullptr, nullptr, &value, sizeof value);
  }
}

}  // namespace rdmalloc

// What jemalloc makes every arena with (its arena_config_default, as its
// users see it: third_party/import_jemalloc.sh): rdmalloc's hooks, so that no
// arena, lazily made automatic arenas included, ever serves memory from
// outside the heap; and the arenas' own metadata (arena structs, extent
// descriptors) off the hooks, mapped by jemalloc itself: no key ever covers
// allocator state, and metadata, never freed, never keeps a region.
extern "C" {
extern const ArenaConfig rdmj_arena_config;
const ArenaConfig rdmj_arena_config = {&rdmalloc::g_hooks, false};

// Arena 0 takes its hooks from base 0, which jemalloc's base_boot makes with
// jemalloc's own: jemalloc's start-up calls this instead, which gives base 0's
// data extents rdmalloc's hooks before jemalloc maps its first extent (its
// metadata stays on jemalloc's).
bool rdmj_base_boot(void* tsdn);
bool rdmj_base_boot(void* tsdn) {
  if (je_base_boot(tsdn)) return true;
  je_base_extent_hooks_set(je_b0get(), &rdmalloc::g_hooks);
  return false;
}
}

// Applied after MALLOC_CONF, so the user cannot undo what the design needs:
// retain:false makes jemalloc give every unused extent back through dalloc
// (rdmalloc's heap then does the retaining, registration-aware);
// oversize_threshold:0 means no huge arena: a huge block is served by the
// thread's own arena, so threads do not meet on one arena and one shard.
extern "C" {
__attribute__((visibility("hidden"))) extern const char* malloc_conf_2_conf_harder;
const char* malloc_conf_2_conf_harder = "retain:false,oversize_threshold:0";

// The size from which every arena gives a freed extent back to rdmalloc's
// heap at once, read by jemalloc's arena_new (third_party/
// jemalloc_rdmalloc.patch). Unpatched, an arena takes jemalloc's
// oversize_threshold, which is past every size when there is no huge arena:
// every arena but arena 0 kept freed blocks of any size for its whole decay
// time (10 s), outside rdmalloc's retention bound, and two threads looping
// over large blocks held 1.6x jemalloc's RSS. Setting oversize_threshold
// back to 8 MiB fixed that, but it also routes requests that large to the
// huge arena, or to arena 0 when there is none: every thread's blocks of
// 8 MiB or more then met in arena 0 and its shard.
extern const size_t rdmj_return_at_once __attribute__((visibility("hidden")));
const size_t rdmj_return_at_once = rdmalloc::kLargeReturnedAtOnce;
// A freed block this large goes back at once whatever it coalesced with
// (jemalloc's extent_record, patched). Kept in jemalloc's dirty cache, a
// block of which the program wrote only the head held its untouched pages for
// the decay time, and the heads of earlier blocks stayed resident across the
// cache: a loop over such 1-32 MiB blocks peaked at 2.3x jemalloc's RSS.
extern const size_t rdmj_large_block_returned __attribute__((visibility("hidden")));
const size_t rdmj_large_block_returned = rdmalloc::kLargeBlock;
// What jemalloc's ehooks_merge, patched, needs for MergeAsked.
extern const uintptr_t rdmj_merge_chunk_mask __attribute__((visibility("hidden")));
const uintptr_t rdmj_merge_chunk_mask = rdmalloc::kChunkSize - 1;
extern const size_t rdmj_merge_asked_from __attribute__((visibility("hidden")));
const size_t rdmj_merge_asked_from = rdmalloc::kSmallBlocksCoalesceBelow;
// MALLOC_CONF's dirty_decay_ms, once jemalloc has booted.
extern __attribute__((visibility("hidden"))) ssize_t je_opt_dirty_decay_ms;
}

namespace rdmalloc {

void NoteJemallocDecay(long decay_ms) {
  rdmj_free(rdmj_malloc(1));  // jemalloc booted: its options are final
  long decay = decay_ms != kDecayUnset ? decay_ms : static_cast<long>(je_opt_dirty_decay_ms);
  g_jemalloc_decays.store(decay != 0, std::memory_order_relaxed);
}

}  // namespace rdmalloc
