// A lock that is safe inside jemalloc's extent hooks: no allocation, constant
// initialisation, and a fork child can reset it (its holder no longer exists).
#ifndef RDMALLOC_ALLOCATOR_SPIN_LOCK_H_
#define RDMALLOC_ALLOCATOR_SPIN_LOCK_H_

#include <sched.h>

#include <atomic>

namespace rdmalloc {

class SpinLock {
 public:
  constexpr SpinLock() = default;
  SpinLock(const SpinLock&) = delete;
  SpinLock& operator=(const SpinLock&) = delete;

  // Sequentially consistent on purpose: Heap::RunRelease relies on a failed
  // TryLock and an Unlock never both missing a flag set in between.
  bool TryLock() { return !held_.exchange(true); }
  void Lock() {
    for (int spins = 0; !TryLock(); spins++) {
      while (held_.load(std::memory_order_relaxed)) {
        if (++spins > 64) sched_yield();
        else Relax();
      }
    }
  }
  void Unlock() { held_.store(false); }
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
