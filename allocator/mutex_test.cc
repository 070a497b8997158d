// The mutex under contention: it excludes, TryLock never waits, no waiter is
// left asleep, and waiters sleep rather than take the CPU from the holder.
#include "allocator/mutex.h"

#include <errno.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include "allocator/thread_cpu.h"

namespace rdmalloc {
namespace {

// More threads than cores, short holds: every path (the first CAS, the spin,
// the sleep and the wake) is taken many times. A lost wake hangs the test.
// errno stays the caller's: free() must keep it (POSIX), and its hooks lock.
TEST(Mutex, ExcludesAndWakesEveryWaiterAndKeepsErrno) {
  Mutex<LockRank::kHeap> lock;
  constexpr int kThreads = 8, kRounds = 100000;
  uint64_t counter = 0;  // plain on purpose: the lock alone guards it
  std::atomic<uint64_t> errno_changed{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; t++) {
    threads.emplace_back([&] {
      for (int i = 0; i < kRounds; i++) {
        errno = EDOM;
        {
          LockGuard<decltype(lock)> g(lock);
          counter++;
          if (i % 256 == 0) std::this_thread::yield();  // now and then, waiters sleep
        }
        if (errno != EDOM) errno_changed++;
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(counter, uint64_t{kThreads} * kRounds);
  EXPECT_EQ(errno_changed.load(), 0u);
}

TEST(Mutex, TryLockFailsWhileHeldAndNeverWaits) {
  Mutex<LockRank::kRegion> lock;
  ASSERT_TRUE(lock.TryLock());
  std::atomic<int> other{-1};
  std::thread([&] { other = lock.TryLock(); }).join();
  EXPECT_EQ(other.load(), 0);
  lock.Unlock();
  std::thread([&] {
    other = lock.TryLock();
    lock.Unlock();
  }).join();
  EXPECT_EQ(other.load(), 1);
}

// A holder off the CPU (in a system call: pinning a region, a ring's
// transfer) must not have its waiters spend the CPU it will need. Before the
// waiters slept, 6 waiters spent about 2 cores' worth for the whole hold.
TEST(Mutex, WaitersSleepWhileTheHolderIsOffTheCpu) {
  Mutex<LockRank::kRegion> lock;
  constexpr int kWaiters = 6;
  constexpr auto kHold = std::chrono::milliseconds(300);
  std::atomic<uint64_t> waiter_cpu_ns{0};
  std::atomic<int> waiting{0};
  lock.Lock();
  std::vector<std::thread> waiters;
  for (int i = 0; i < kWaiters; i++) {
    waiters.emplace_back([&] {
      uint64_t t0 = ThreadCpuNs();
      waiting++;
      lock.Lock();
      lock.Unlock();
      waiter_cpu_ns += ThreadCpuNs() - t0;
    });
  }
  while (waiting.load() < kWaiters) std::this_thread::yield();
  std::this_thread::sleep_for(kHold);
  lock.Unlock();
  for (auto& t : waiters) t.join();
  uint64_t hold_ns = std::chrono::nanoseconds(kHold).count();
  printf("%d waiters spent %.1f ms of CPU during a %.0f ms hold\n", kWaiters,
         waiter_cpu_ns.load() / 1e6, hold_ns / 1e6);
  EXPECT_LT(waiter_cpu_ns.load(), hold_ns / 10);
}

}  // namespace
}  // namespace rdmalloc
