// The witness (allocator/lock_order.h), built here with RDMALLOC_WITNESS: the
// acquisitions the lock order forbids abort with both ranks named, and the
// ones it allows pass. --config=ubsan and --config=tsan build the whole
// allocator with the witness, so every test there checks the order too.
#include "allocator/lock_order.h"

#include <gtest/gtest.h>

#include "allocator/mutex.h"

namespace rdmalloc {
namespace {

TEST(LockOrder, AscendingRanksAreAllowed) {
  Mutex<LockRank::kApi> api;
  Mutex<LockRank::kRegion> region;
  Mutex<LockRank::kHeap> heap;
  Mutex<LockRank::kReleaseQueue> queue;
  api.Lock();
  region.Lock();
  witness::CallingJemalloc();  // ibv_reg_mr mallocs under reg_lock: allowed
  heap.Lock();
  queue.Lock();
  queue.Unlock();
  heap.Unlock();
  region.Unlock();
  api.Unlock();
}

TEST(LockOrder, TakingALowerRankWhileHoldingAHigherOneAborts) {
  auto heap_then_api = [] {
    Mutex<LockRank::kHeap> heap;
    Mutex<LockRank::kApi> api;
    heap.Lock();
    api.Lock();
  };
  EXPECT_DEATH(heap_then_api(),
      "taking 'api' \\(rank 3\\) while holding 'heap' \\(rank 8\\)");
}

TEST(LockOrder, TwoLocksOfOneRankAbort) {
  auto two_regions = [] {
    Mutex<LockRank::kRegion> a;
    Mutex<LockRank::kRegion> b;
    a.Lock();
    b.Lock();
  };
  EXPECT_DEATH(two_regions(),
      "taking 'region registration'");
}

// The fork protocol's series: locks of one rank, each taken while the
// earlier ones are held; anything ranked above them still aborts.
TEST(LockOrder, ASeriesOfOneRankIsAllowedButNotBelowAHigherRank) {
  Mutex<LockRank::kHeap> shard_a, shard_b, pool;
  shard_a.LockInSeries();
  shard_b.LockInSeries();
  pool.LockInSeries();
  pool.Unlock();
  shard_b.Unlock();
  shard_a.Unlock();
  EXPECT_DEATH(
      {
        Mutex<LockRank::kReleaseQueue> queue;
        Mutex<LockRank::kHeap> shard;
        queue.Lock();
        shard.LockInSeries();
      },
      "taking 'heap' \\(rank 8\\) while holding 'release queue' \\(rank 9\\)");
}

TEST(LockOrder, CallingJemallocWhileHoldingAHookLockAborts) {
  EXPECT_DEATH(
      {
        Mutex<LockRank::kHeap> heap;
        heap.Lock();
        witness::CallingJemalloc();
      },
      "taking 'jemalloc' \\(rank 7\\) while holding 'heap'");
}

TEST(LockOrder, HooksMayOnlyTryLockBelowJemalloc) {
  Mutex<LockRank::kRegion> region;
  {
    HookScope in_jemalloc;
    ASSERT_TRUE(region.TryLock());  // TryLock never waits: allowed
    region.Unlock();
  }
  EXPECT_DEATH(
      {
        HookScope in_jemalloc;
        region.Lock();
      },
      "taking 'region registration' \\(rank 5\\) while holding 'jemalloc' \\(rank 7\\)");
}

TEST(LockOrder, AForkChildForgetsWhatItHeld) {
  Mutex<LockRank::kHeap> heap;
  Mutex<LockRank::kApi> api;
  heap.Lock();
  heap.ResetAfterFork();
  witness::ForgetHeld();
  api.Lock();  // no violation: nothing is held any more
  api.Unlock();
}

}  // namespace
}  // namespace rdmalloc
