// One-time start of rdmalloc, on the first allocation (or API call).
#ifndef RDMALLOC_ALLOCATOR_INIT_H_
#define RDMALLOC_ALLOCATOR_INIT_H_

#include <atomic>

#include "allocator/lock_order.h"

namespace rdmalloc {

// kForked: a fork child's first allocation or rdmalloc_* call restarts what
// did not survive fork (the release thread), outside jemalloc and our locks.
enum : int { kUninitialised = 0, kInitialising = 1, kReady = 2, kForked = 3 };
// jemalloc reads it under this name (third_party/jemalloc_rdmalloc.patch):
// every thread is on its slow paths unless it is kReady, and an allocation's
// slow path calls rdmj_start() then. Whoever changes it makes every thread
// recompute (rdmj_recompute_fast_paths).
extern std::atomic<int> g_init_state __asm__("rdmj_init_state") __attribute__((visibility("hidden")));
static_assert(kReady == 2, "third_party/jemalloc_rdmalloc.patch tests for 2");
static_assert(sizeof(std::atomic<int>) == sizeof(int) && std::atomic<int>::is_always_lock_free,
              "jemalloc reads it as a plain int");

void EnsureInitialisedSlow();

// Started, and not a fork child that has yet to restart.
inline bool Initialised() {
  witness::CallingJemalloc();
  return g_init_state.load(std::memory_order_acquire) == kReady;
}

// The check every malloc pays: one load of a flag that changes only at
// start-up and in a fork child.
inline void EnsureInitialised() {
  witness::CallingJemalloc();
  if (__builtin_expect(g_init_state.load(std::memory_order_acquire) != kReady, 0))
    EnsureInitialisedSlow();
}

}  // namespace rdmalloc

#endif  // RDMALLOC_ALLOCATOR_INIT_H_
