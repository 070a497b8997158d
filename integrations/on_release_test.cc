// rdmalloc_on_release itself: one call per released region with exactly its
// range, after rdmalloc's own registration is gone and before the unmap, never
// at free() while the region is kept; freed pages stay unpurged while an
// observer exists; removal stops calls and is followed by one last call
// fn(NULL, 0, arg); the table's limits.
#include <gtest/gtest.h>
#include <sys/mman.h>

#include <atomic>
#include <mutex>
#include <vector>

#include "integrations/notify_test_util.h"

namespace rdmalloc_test {
namespace {

bool Mapped(uintptr_t addr, size_t len) {
  std::vector<unsigned char> pages((len + 4095) / 4096);
  return mincore(reinterpret_cast<void*>(addr), len, pages.data()) == 0;
}

// What an observer saw at each call, checked afterwards on the test thread.
struct Call {
  Span range;
  bool mapped;       // the range was still mapped
  int lookup;        // rdmalloc_lookup of its first byte
};

struct Recorder {
  std::mutex mu;
  std::vector<Call> calls;
  std::atomic<int> goodbyes{0};
  std::vector<Call> For(const void* p) {
    std::lock_guard<std::mutex> g(mu);
    std::vector<Call> hits;
    for (const Call& c : calls)
      if (c.range.Contains(p)) hits.push_back(c);
    return hits;
  }
  size_t Count() {
    std::lock_guard<std::mutex> g(mu);
    return calls.size();
  }
};

void Record(void* addr, size_t len, void* arg) {
  auto* rec = static_cast<Recorder*>(arg);
  if (addr == nullptr) {  // the last call, after removal
    rec->goodbyes++;
    return;
  }
  Call c{{reinterpret_cast<uintptr_t>(addr), len}, Mapped(reinterpret_cast<uintptr_t>(addr), len), 0};
  rdmalloc_keys k;
  c.lookup = rdmalloc_lookup(addr, 1, nullptr, &k);
  void* scratch = malloc(256);  // observers may allocate
  free(scratch);
  std::lock_guard<std::mutex> g(rec->mu);
  rec->calls.push_back(c);
}

constexpr size_t kLarge = size_t{6} << 20;  // > RDMALLOC_REGION_SIZE (2M): a region of its own

// Removes rec's observer and waits for its last call: rec lives on the stack.
void Remove(Recorder& rec) {
  EXPECT_EQ(rdmalloc_on_release_remove(Record, &rec), RDMALLOC_OK);
  EXPECT_TRUE(Eventually([&] { return rec.goodbyes.load() == 1; })) << "no last call";
}

TEST(OnRelease, OneCallWithTheRegionBetweenDeregistrationAndUnmap) {
  PrivateArena arena;
  ASSERT_TRUE(arena.ok());
  Recorder rec;
  ASSERT_EQ(rdmalloc_on_release(Record, &rec), RDMALLOC_OK);
  void* b = arena.Alloc(kLarge);
  ASSERT_NE(b, nullptr);
  memset(b, 1, kLarge);
  Span region = RegionSpan(b);  // also registers it
  ASSERT_GE(region.len, kLarge);
  uint64_t registered = Stats().bytes_registered;

  free(b);  // kept by jemalloc (RDMALLOC_DECAY_MS=-1)
  Stats();
  EXPECT_TRUE(rec.For(b).empty()) << "called at free(), before any release";

  ForceDecay();
  ASSERT_TRUE(Eventually([&] { return !rec.For(b).empty(); })) << "release never notified";
  std::vector<Call> calls = rec.For(b);
  ASSERT_EQ(calls.size(), 1u);
  EXPECT_EQ(calls[0].range, region);
  EXPECT_TRUE(calls[0].mapped) << "called after the unmap";
  EXPECT_EQ(calls[0].lookup, RDMALLOC_ENOTOURS) << "rdmalloc still served it during the call";
  EXPECT_LE(Stats().bytes_registered + region.len, registered);
  EXPECT_TRUE(Eventually([&] { return !Mapped(region.begin, region.len); }));
  Remove(rec);
}

// Two 64 KiB buffers in one 2 MiB region (regions are 2 MiB-aligned): with p
// freed and decayed, q keeps the region. p's pages keep their bytes while an
// observer exists; without one they are purged (the control). Neither region
// is looked up, so rdmalloc does not register (and so never pins) them.
bool FreedPagesKeptWithObserverCount(int observers_wanted) {
  PrivateArena arena;
  constexpr size_t kSmall = 64 << 10;
  void* p = arena.Alloc(kSmall);
  void* q = arena.Alloc(kSmall);
  EXPECT_TRUE(arena.ok() && p != nullptr && q != nullptr);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(p) >> 21, reinterpret_cast<uintptr_t>(q) >> 21);
  EXPECT_EQ(Stats().observers, uint64_t(observers_wanted));
  FillPattern(p, kSmall, 7);
  const char* freed = AddressOnly(p);
  free(p);
  ForceDecay();
  Stats();
  bool kept = HasPattern(freed, kSmall, 7);  // still mapped: q holds the region
  free(q);
  return kept;
}

TEST(OnRelease, FreedPagesNotPurgedWhileObserved) {
  Recorder rec;
  ASSERT_EQ(rdmalloc_on_release(Record, &rec), RDMALLOC_OK);
  EXPECT_TRUE(FreedPagesKeptWithObserverCount(1)) << "purged with an observer";
  Remove(rec);
  EXPECT_FALSE(FreedPagesKeptWithObserverCount(0)) << "control: not purged without observers";
}

TEST(OnRelease, RemovedObserverIsNotCalled) {
  PrivateArena arena;
  ASSERT_TRUE(arena.ok());
  Recorder kept, removed;
  ASSERT_EQ(rdmalloc_on_release(Record, &kept), RDMALLOC_OK);
  ASSERT_EQ(rdmalloc_on_release(Record, &removed), RDMALLOC_OK);
  Remove(removed);
  void* b = arena.Alloc(kLarge);
  ASSERT_NE(b, nullptr);
  memset(b, 1, kLarge);
  const char* freed = AddressOnly(b);
  free(b);
  ForceDecay();
  ASSERT_TRUE(Eventually([&] { return !kept.For(freed).empty(); }));
  EXPECT_EQ(removed.Count(), 0u);
  EXPECT_EQ(removed.goodbyes.load(), 1);
  Remove(kept);
}

struct SelfRemoval {
  std::atomic<int> calls{0}, goodbyes{0};
};

void RemoveSelf(void* addr, size_t, void* arg) {
  auto* self = static_cast<SelfRemoval*>(arg);
  if (addr == nullptr) {
    self->goodbyes++;
    return;
  }
  self->calls++;
  rdmalloc_on_release_remove(RemoveSelf, arg);
}

TEST(OnRelease, ObserverMayRemoveItself) {
  PrivateArena arena;
  ASSERT_TRUE(arena.ok());
  SelfRemoval self;
  ASSERT_EQ(rdmalloc_on_release(RemoveSelf, &self), RDMALLOC_OK);
  for (int i = 0; i < 2; i++) {
    void* b = arena.Alloc(kLarge);
    ASSERT_NE(b, nullptr);
    memset(b, 1, kLarge);
    uint64_t released = Stats().regions_released;
    free(b);
    ForceDecay();
    ASSERT_TRUE(Eventually([&] { return Stats().regions_released > released; }));
  }
  EXPECT_EQ(self.calls.load(), 1);
  EXPECT_EQ(rdmalloc_on_release_remove(RemoveSelf, &self), RDMALLOC_EINVAL);
  EXPECT_TRUE(Eventually([&] { return self.goodbyes.load() == 1; })) << "no last call";
}

// Counts last calls only.
void CountGoodbyes(void* addr, size_t, void* arg) {
  if (addr == nullptr) static_cast<std::atomic<int>*>(arg)->fetch_add(1);
}

TEST(OnRelease, TableLimits) {
  std::atomic<int> args[9] = {};
  EXPECT_EQ(rdmalloc_on_release(nullptr, &args[0]), RDMALLOC_EINVAL);
  EXPECT_EQ(rdmalloc_on_release_remove(CountGoodbyes, &args[0]), RDMALLOC_EINVAL);  // never added
  for (int i = 0; i < 8; i++) ASSERT_EQ(rdmalloc_on_release(CountGoodbyes, &args[i]), RDMALLOC_OK) << i;
  EXPECT_EQ(rdmalloc_on_release(CountGoodbyes, &args[0]), RDMALLOC_EINVAL);  // already there
  EXPECT_EQ(rdmalloc_on_release(CountGoodbyes, &args[8]), RDMALLOC_EINVAL);  // full
  for (int i = 0; i < 8; i++) EXPECT_EQ(rdmalloc_on_release_remove(CountGoodbyes, &args[i]), RDMALLOC_OK);
  EXPECT_EQ(Stats().observers, 0u);
  for (int i = 0; i < 8; i++)
    EXPECT_TRUE(Eventually([&] { return args[i].load() == 1; })) << "no last call for " << i;
  EXPECT_EQ(args[8].load(), 0);
}

}  // namespace
}  // namespace rdmalloc_test
