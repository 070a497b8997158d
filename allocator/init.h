// One-time start of rdmalloc, on the first allocation (or API call).
#ifndef RDMALLOC_ALLOCATOR_INIT_H_
#define RDMALLOC_ALLOCATOR_INIT_H_

#include <atomic>

namespace rdmalloc {

enum : int { kUninitialised = 0, kInitialising = 1, kReady = 2 };
extern std::atomic<int> g_init_state;

void EnsureInitialisedSlow();

// The check every malloc pays: one load of a flag that never changes again.
inline void EnsureInitialised() {
  if (__builtin_expect(g_init_state.load(std::memory_order_acquire) != kReady, 0))
    EnsureInitialisedSlow();
}

}  // namespace rdmalloc

#endif  // RDMALLOC_ALLOCATOR_INIT_H_
