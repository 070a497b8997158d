// A lock that is safe inside jemalloc's extent hooks: no allocation, constant
// initialisation, and a fork child can reset it (its holder no longer exists).
// Every lock has its rank in the one lock order (allocator/lock_order.h).
#ifndef RDMALLOC_ALLOCATOR_SPIN_LOCK_H_
#define RDMALLOC_ALLOCATOR_SPIN_LOCK_H_

#include <sched.h>

#include <atomic>

#include "allocator/lock_order.h"

namespace rdmalloc {

class SpinLock {
 public:
  constexpr explicit SpinLock(LockRank rank) : rank_(rank) {}
  SpinLock(const SpinLock&) = delete;
  SpinLock& operator=(const SpinLock&) = delete;

  // Sequentially consistent on purpose: Heap::RunRelease relies on a failed
  // TryLock and an Unlock never both missing a flag set in between.
  bool TryLock() {
    if (held_.exchange(true)) return false;
    witness::Acquired(rank_);
    return true;
  }
  void Lock() {
    witness::Acquiring(rank_);
    for (int spins = 0; held_.exchange(true); spins++) {
      while (held_.load(std::memory_order_relaxed)) {
        if (++spins > 64) sched_yield();
        else Relax();
      }
    }
    witness::Acquired(rank_);
  }
  void Unlock() {
    witness::Released(rank_);
    held_.store(false);
  }
  // Only in a fork child, where the thread that held it is gone.
  void ResetAfterFork() { held_.store(false, std::memory_order_relaxed); }
  LockRank rank() const { return rank_; }

 private:
  static void Relax() {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
  }
  std::atomic<bool> held_{false};
  const LockRank rank_;
};

class SpinLockGuard {
 public:
  explicit SpinLockGuard(SpinLock& l) : l_(l) { l_.Lock(); }
  ~SpinLockGuard() { l_.Unlock(); }
  SpinLockGuard(const SpinLockGuard&) = delete;
  SpinLockGuard& operator=(const SpinLockGuard&) = delete;

 private:
  SpinLock& l_;
};

}  // namespace rdmalloc

#endif  // RDMALLOC_ALLOCATOR_SPIN_LOCK_H_
