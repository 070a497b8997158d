// rdmalloc's libfabric memory monitor. No provider on this machine uses
// libfabric's MR cache (only verbs and efa do; see docs/NOTIFICATIONS.md), so
// the test drives the monitor the way libfabric's cache does (start,
// subscribe, valid, stop) and records what arrives through import_ops->notify;
// a second test imports rdmalloc's monitor into the real libfabric.
#include <gtest/gtest.h>
#include <sys/mman.h>

#include <mutex>
#include <vector>

#include <rdma/fi_errno.h>

#include "integrations/libfabric_monitor.h"
#include "integrations/notify_test_util.h"

namespace rdmalloc_test {
namespace {

using rdmalloc::ReleaseMonitor;

// What libfabric's import sets: the notify op, here a recorder.
std::mutex g_mu;
std::vector<Span> g_notified;

void RecordNotify(fid_mem_monitor*, const void* addr, size_t len) {
  std::lock_guard<std::mutex> g(g_mu);
  g_notified.push_back({reinterpret_cast<uintptr_t>(addr), len});
}
fi_ops_mem_notify g_recorder = {sizeof(fi_ops_mem_notify), RecordNotify};

size_t NotifiedCount() {
  std::lock_guard<std::mutex> g(g_mu);
  return g_notified.size();
}

// Notifications whose range holds p.
std::vector<Span> NotifiedFor(const void* p) {
  std::lock_guard<std::mutex> g(g_mu);
  std::vector<Span> hits;
  for (const Span& s : g_notified)
    if (s.Contains(p)) hits.push_back(s);
  return hits;
}

class LibfabricMonitor : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(arena_.ok());
    rdmalloc::InitReleaseMonitor(&monitor_);
    monitor_.fid.import_ops = &g_recorder;
  }
  fid_mem_monitor* fid() { return &monitor_.fid; }
  const fi_ops_mem_monitor& ops() { return *monitor_.fid.export_ops; }

  ReleaseMonitor monitor_;
  PrivateArena arena_;
};

TEST_F(LibfabricMonitor, SubscribesOnlyRdmallocHeap) {
  EXPECT_EQ(monitor_.fid.fid.fclass, size_t{FI_CLASS_MEM_MONITOR});
  EXPECT_EQ(ops().size, sizeof(fi_ops_mem_monitor));
  void* p = arena_.Alloc(4096);
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(ops().subscribe(fid(), p, 4096), 0);
  EXPECT_TRUE(ops().valid(fid(), p, 4096));
  // Nobody would tell libfabric when these go away: keep them out of its cache.
  char stack[64];
  EXPECT_NE(ops().subscribe(fid(), stack, sizeof stack), 0);
  void* page = mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(page, MAP_FAILED);
  EXPECT_NE(ops().subscribe(fid(), page, 4096), 0);
  munmap(page, 4096);
  free(p);
}

// Notified exactly once, with exactly the released region, when rdmalloc
// releases it: not at free(), not while stopped.
TEST_F(LibfabricMonitor, NotifiesReleasedRegionOnceAfterStart) {
  constexpr size_t kSize = size_t{6} << 20;  // > RDMALLOC_REGION_SIZE: own region
  // Released before start: nobody is told.
  size_t notified = NotifiedCount();
  void* early = arena_.Alloc(kSize);
  ASSERT_NE(early, nullptr);
  memset(early, 1, kSize);
  uint64_t released = Stats().regions_released;
  free(early);
  ForceDecay();
  ASSERT_TRUE(Eventually([&] { return Stats().regions_released > released; }));
  EXPECT_EQ(NotifiedCount(), notified);

  ASSERT_EQ(ops().start(fid()), 0);
  void* b = arena_.Alloc(kSize);
  ASSERT_NE(b, nullptr);
  memset(b, 2, kSize);
  Span region = RegionSpan(b);
  ASSERT_GE(region.len, kSize);
  ASSERT_EQ(ops().subscribe(fid(), b, kSize), 0);

  free(b);  // kept by jemalloc (RDMALLOC_DECAY_MS=-1)
  Stats();
  EXPECT_TRUE(NotifiedFor(b).empty()) << "notified at free(), before any release";
  EXPECT_TRUE(ops().valid(fid(), b, kSize));

  ForceDecay();
  ASSERT_TRUE(Eventually([&] { return !NotifiedFor(b).empty(); })) << "release never notified";
  std::vector<Span> hits = NotifiedFor(b);
  ASSERT_EQ(hits.size(), 1u);
  EXPECT_EQ(hits[0], region);

  // Stopped: a later release reaches nobody.
  ops().stop(fid());
  notified = NotifiedCount();
  void* late = arena_.Alloc(kSize);
  ASSERT_NE(late, nullptr);
  memset(late, 3, kSize);
  released = Stats().regions_released;
  free(late);
  ForceDecay();
  ASSERT_TRUE(Eventually([&] { return Stats().regions_released > released; }));
  EXPECT_EQ(NotifiedCount(), notified);
}

// The real libfabric takes rdmalloc's monitor as its imported monitor (the
// one its MR caches then use), once: a second import is refused as busy.
TEST(LibfabricImport, RealLibfabricHoldsRdmallocMonitor) {
  ASSERT_EQ(rdmalloc_notify_libfabric(), RDMALLOC_OK) << "errno " << errno;
  EXPECT_EQ(rdmalloc_notify_libfabric(), RDMALLOC_OK);  // idempotent
  ReleaseMonitor other;
  rdmalloc::InitReleaseMonitor(&other);
  EXPECT_EQ(fi_import(FI_VERSION(1, 13), "mr_cache", nullptr, 0, 0, &other.fid.fid, nullptr),
            -FI_EBUSY);
}

}  // namespace
}  // namespace rdmalloc_test
