// The mallctl guard: every control path into jemalloc (mallctl by name,
// mallctlnametomib + mallctlbymib) ends here, so that no arena can serve
// memory outside rdmalloc's hooks and no hook rdmalloc installed can be
// replaced under live registrations.
//
// - Creating an arena (arenas.create, experimental.arenas_create_ext)
//   without hooks of the caller's own gives it rdmalloc's hooks.
// - Writing arena.<i>.extent_hooks of an arena that runs on rdmalloc's hooks
//   fails with EPERM: jemalloc could then purge or unmap registered pages.
// - arena.<i>.destroy and arena.<i>.reset of an arena rdmalloc made for itself
//   (an access class's) fail with EPERM: other callers' memory lives there.
// Arenas made with the caller's own hooks stay entirely the caller's.
// - arena.<i>.purge and arena.<i>.decay also give back what rdmalloc keeps
//   for reuse (RDMALLOC_RETAIN).
#ifndef RDMALLOC_ALLOCATOR_ARENA_CONTROL_H_
#define RDMALLOC_ALLOCATOR_ARENA_CONTROL_H_

#include <jemalloc/jemalloc.h>

#include <cstddef>

namespace rdmalloc {

// Once, after rdmalloc's hooks are installed on every automatic arena:
// `ours` are rdmalloc's hooks, `defaults` jemalloc's own; `give_back` runs
// after arena.<i>.purge and arena.<i>.decay (rdmalloc gives back what it
// keeps for reuse too).
void InitArenaControl(extent_hooks_t* ours, extent_hooks_t* defaults, void (*give_back)());

// A new arena on `hooks`; `internal` marks it rdmalloc's own (no one may
// destroy or reset it). Returns its index, 0 if it cannot be made.
unsigned CreateArena(extent_hooks_t* hooks, bool internal);

// mallctl and mallctlbymib with the guard.
int ControlMallctl(const char* name, void* oldp, size_t* oldlenp, void* newp, size_t newlen);
int ControlMallctlByMib(const size_t* mib, size_t miblen, void* oldp, size_t* oldlenp, void* newp,
                        size_t newlen);

}  // namespace rdmalloc

#endif  // RDMALLOC_ALLOCATOR_ARENA_CONTROL_H_
