// A lock that is safe inside jemalloc's extent hooks: no allocation, constant
// initialisation, and a fork child can reset it (its holder no longer exists).
// Every lock has its rank in the one lock order (allocator/lock_order.h). The
// rank is part of the type, not a member: an unheld lock is all zero bytes,
// so objects holding locks (the heap and its 16384 region descriptors) are
// constant-initialised into .bss and cost no page of the library file.
#ifndef RDMALLOC_ALLOCATOR_SPIN_LOCK_H_
#define RDMALLOC_ALLOCATOR_SPIN_LOCK_H_

#include <sched.h>

#include <atomic>

#include "allocator/lock_order.h"

namespace rdmalloc {

template <LockRank kRank>
class SpinLock {
 public:
  constexpr SpinLock() = default;
  SpinLock(const SpinLock&) = delete;
  SpinLock& operator=(const SpinLock&) = delete;

  // Sequentially consistent on purpose: Heap::RunRelease relies on a failed
  // TryLock and an Unlock never both missing a flag set in between.
  bool TryLock() {
    if (held_.exchange(true)) return false;
    witness::Acquired(kRank);
    return true;
  }
  void Lock() {
    witness::Acquiring(kRank);
    for (int spins = 0; held_.exchange(true); spins++) {
      while (held_.load(std::memory_order_relaxed)) {
        if (++spins > 64) sched_yield();
        else Relax();
      }
    }
    witness::Acquired(kRank);
  }
  void Unlock() {
    witness::Released(kRank);
    held_.store(false);
  }
  // Only in a fork child, where the thread that held it is gone.
  void ResetAfterFork() { held_.store(false, std::memory_order_relaxed); }

 private:
  static void Relax() {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
  }
  std::atomic<bool> held_{false};
};

template <typename Lock>
class SpinLockGuard {
 public:
  explicit SpinLockGuard(Lock& l) : l_(l) { l_.Lock(); }
  ~SpinLockGuard() { l_.Unlock(); }
  SpinLockGuard(const SpinLockGuard&) = delete;
  SpinLockGuard& operator=(const SpinLockGuard&) = delete;

 private:
  Lock& l_;
};

}  // namespace rdmalloc

#endif  // RDMALLOC_ALLOCATOR_SPIN_LOCK_H_
