// rdmalloc's lock, safe inside jemalloc's extent hooks: no
// allocation, constant initialisation, and a fork child can reset it (its
// holder no longer exists). Every lock has its rank in the one lock order
// (allocator/lock_order.h). The rank is part of the type, not a member: an
// unheld lock is all zero bytes, so objects holding locks (the heap and its
// 16384 region descriptors) are constant-initialised into .bss and cost no
// page of the library file.
//
// A waiter spins briefly, then sleeps in the kernel (futex) until the holder
// lets go. Some holds are long (registering a region pins it page by page; a
// uring domain's ring waits for its transfer), and waiters that only yielded
// took the CPU such a holder needed: with more threads than cores, a thread
// could wait seconds for a region's lock.
#ifndef RDMALLOC_ALLOCATOR_MUTEX_H_
#define RDMALLOC_ALLOCATOR_MUTEX_H_

#include <atomic>
#include <cstdint>

#include "allocator/futex.h"
#include "allocator/lock_order.h"

namespace rdmalloc {

template <LockRank kRank>
class Mutex {
 public:
  constexpr Mutex() = default;
  Mutex(const Mutex&) = delete;
  Mutex& operator=(const Mutex&) = delete;

  // Sequentially consistent on purpose: Heap::RunRelease relies on a failed
  // TryLock and an Unlock never both missing a flag set in between.
  bool TryLock() {
    uint32_t free = kFree;
    if (!state_.compare_exchange_strong(free, kHeld)) return false;
    witness::Acquired(kRank);
    return true;
  }
  void Lock() {
    witness::Acquiring(kRank);
    Acquire();
  }
  // The next of several locks of this rank, all taken in one fixed order
  // (only the fork protocol holds more than one): it may wait, since every
  // thread that holds two takes them in that order.
  void LockInSeries() {
    witness::AcquiringInSeries(kRank);
    Acquire();
  }
  void Unlock() {
    witness::Released(kRank);
    if (state_.exchange(kFree) == kSleepers) FutexWake(&state_, 1);
  }
  // Only in a fork child, where the thread that held it is gone.
  void ResetAfterFork() { state_.store(kFree, std::memory_order_relaxed); }

 private:
  // kSleepers: held, and a waiter may be asleep; its Unlock wakes one.
  enum : uint32_t { kFree = 0, kHeld = 1, kSleepers = 2 };
  static constexpr int kSpins = 100;

  void Acquire() {
    uint32_t free = kFree;
    if (!state_.compare_exchange_strong(free, kHeld)) LockContended();
    witness::Acquired(kRank);
  }
  void LockContended() {
    // Most holds are a few hundred instructions: spin first.
    for (int i = 0; i < kSpins; i++) {
      Relax();
      uint32_t free = kFree;
      if (state_.load(std::memory_order_relaxed) == kFree &&
          state_.compare_exchange_strong(free, kHeld))
        return;
    }
    // Taking it as kSleepers may wake one sleeper needlessly later; never
    // marking it so could leave one asleep for good.
    while (state_.exchange(kSleepers) != kFree) FutexWait(&state_, uint32_t{kSleepers});
  }
  static void Relax() {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
  }
  std::atomic<uint32_t> state_{kFree};  // the futex word
};

template <typename Lock>
class LockGuard {
 public:
  explicit LockGuard(Lock& l) : l_(l) { l_.Lock(); }
  ~LockGuard() { l_.Unlock(); }
  LockGuard(const LockGuard&) = delete;
  LockGuard& operator=(const LockGuard&) = delete;

 private:
  Lock& l_;
};

}  // namespace rdmalloc

#endif  // RDMALLOC_ALLOCATOR_MUTEX_H_
