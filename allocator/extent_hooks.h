// rdmalloc's jemalloc extent hooks: every arena gets them, so every extent
// jemalloc hands out comes from the registered heap (allocator/heap.h).
#ifndef RDMALLOC_ALLOCATOR_EXTENT_HOOKS_H_
#define RDMALLOC_ALLOCATOR_EXTENT_HOOKS_H_

#include <atomic>
#include <cstddef>

namespace rdmalloc {

// Sets up the mallctl guard and the class lock's fork stage; every arena,
// arena 0 included, gets the hooks when jemalloc makes it (rdmj_arena_config).
// Must run before jemalloc serves any allocation to the program.
void InstallExtentHooks();

// RDMALLOC_DECAY_MS: how long jemalloc keeps freed extents before it gives
// them back through the hooks, for every arena now and to come.
void SetDirtyDecay(long ms);

// A freed extent this large, coalesced with its free neighbours, goes back to
// rdmalloc's heap at once, in every arena, as in stock jemalloc; so does a
// freed large block (kLargeBlock or more, third_party/jemalloc_rdmalloc.patch:
// extent_record). Smaller ones wait in jemalloc's dirty cache for their decay
// time, and the heap does not keep their pages again.
constexpr size_t kLargeReturnedAtOnce = size_t{8} << 20;
// Freed smaller blocks coalesce in jemalloc's dirty cache to less than this
// (the merge hook), as stock jemalloc's stop at the edges of its mappings,
// which start at 2 MiB and grow a size class at a time. jemalloc does not
// split a cached extent for a request 64 times smaller
// (lg_extent_max_active_fit): coalesced up to 8 MiB, they sat resident while
// slabs took fresh pages (mstress peaked at 1.05-1.08x jemalloc's RSS).
constexpr size_t kSmallBlocksCoalesceBelow = size_t{4} << 20;
static_assert(kSmallBlocksCoalesceBelow <= kLargeReturnedAtOnce,
              "smaller blocks must not coalesce to the size that comes back at once");
// Whether jemalloc has a decay time (`decay_ms`: RDMALLOC_DECAY_MS or
// kDecayUnset, then MALLOC_CONF's): without one every freed extent comes
// back at once. Call once jemalloc may boot.
void NoteJemallocDecay(long decay_ms);

// The arena that serves access class c (1..7: RDMALLOC_REMOTE_* bits), made on
// first use; 0 if it cannot be made. Never called from hook context.
unsigned ClassArena(unsigned access_class);
// Set once a class arena exists: only then does a free look for class memory.
// jemalloc's free paths read it under this name (third_party/jemalloc_rdmalloc.patch).
extern std::atomic<bool> g_classes_in_use __asm__("rdmj_classes_in_use")
    __attribute__((visibility("hidden")));
static_assert(sizeof(std::atomic<bool>) == sizeof(bool) && std::atomic<bool>::is_always_lock_free,
              "jemalloc reads it as a plain bool");

}  // namespace rdmalloc

#endif  // RDMALLOC_ALLOCATOR_EXTENT_HOOKS_H_
