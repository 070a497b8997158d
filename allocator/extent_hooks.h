// rdmalloc's jemalloc extent hooks: every arena gets them, so every extent
// jemalloc hands out comes from the registered heap (allocator/heap.h).
#ifndef RDMALLOC_ALLOCATOR_EXTENT_HOOKS_H_
#define RDMALLOC_ALLOCATOR_EXTENT_HOOKS_H_

#include <cstddef>

namespace rdmalloc {

// Installs the hooks on arena 0 and creates every automatic arena with them.
// Must run before jemalloc serves any allocation to the program.
void InstallExtentHooks();

// RDMALLOC_DECAY_MS: how long jemalloc keeps freed extents before it gives
// them back through the hooks, for every arena now and to come.
void SetDirtyDecay(long ms);

// For mallctl("arenas.create") without hooks of the caller's own.
void* RdmallocExtentHooks();

}  // namespace rdmalloc

#endif  // RDMALLOC_ALLOCATOR_EXTENT_HOOKS_H_
