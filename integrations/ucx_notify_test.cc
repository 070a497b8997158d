// UCX's registration cache (ucs_rcache) with UCX's own memory hooks off keeps
// its entry for an rdmalloc buffer while rdmalloc keeps the buffer's region,
// across free() and decay, and drops it when rdmalloc releases the region:
// rdmalloc_notify_ucx() is then the only thing that tells UCX.
#include <gtest/gtest.h>
#include <sys/mman.h>

#include <atomic>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include <ucm/api/ucm.h>
extern "C" {  // rcache.h has no C++ guards of its own
#include <ucs/memory/rcache.h>
}

#include "integrations/notify_test_util.h"

namespace rdmalloc_test {
namespace {

// Stands in for the NIC: counts the registrations the cache makes and drops.
std::atomic<int> g_regs{0}, g_deregs{0};

ucs_status_t MemReg(void*, ucs_rcache_t*, void*, ucs_rcache_region_t*, uint16_t) {
  g_regs++;
  return UCS_OK;
}
void MemDereg(void*, ucs_rcache_t*, ucs_rcache_region_t*) { g_deregs++; }
void Dump(void*, ucs_rcache_t*, ucs_rcache_region_t*, char* buf, size_t max) {
  snprintf(buf, max, "counting");
}

ucs_rcache_t* MakeCache() {
  static const ucs_rcache_ops_t ops = {MemReg, MemDereg, Dump};
  ucs_rcache_params_t params;
  memset(&params, 0, sizeof params);
  params.region_struct_size = sizeof(ucs_rcache_region_t);
  params.alignment = 4096;
  params.max_alignment = 4096;
  params.ucm_events = UCM_EVENT_VM_UNMAPPED;  // what UCX's IB transport asks for
  params.ucm_event_priority = 1000;
  params.ops = &ops;
  params.max_regions = ULONG_MAX;
  params.max_size = SIZE_MAX;
  params.max_unreleased = SIZE_MAX;
  ucs_rcache_t* cache = nullptr;
  return ucs_rcache_create(&params, "rdmalloc-test", nullptr, &cache) == UCS_OK ? cache : nullptr;
}

// The entry is in the cache's page table (flags change under the cache's
// lock, possibly on rdmalloc's release thread).
bool Cached(ucs_rcache_region_t* r) {
  return __atomic_load_n(&r->flags, __ATOMIC_ACQUIRE) & UCS_RCACHE_REGION_FLAG_PGTABLE;
}

class UcxNotify : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    // Before the cache exists: its handler must find the event external.
    // With RDMALLOC_NOTIFY=ucx rdmalloc did it when it loaded; calling again
    // changes nothing, and the observer must already be there.
    if (getenv("RDMALLOC_NOTIFY") != nullptr) {
      struct rdmalloc_stats s;
      rdmalloc_stats(&s, sizeof s);
      if (s.observers != 1) fprintf(stderr, "RDMALLOC_NOTIFY=ucx did not register UCX\n");
      notify_rc_ = s.observers == 1 ? RDMALLOC_OK : RDMALLOC_EINVAL;
    } else {
      notify_rc_ = rdmalloc_notify_ucx();
    }
    if (notify_rc_ == RDMALLOC_OK) cache_ = MakeCache();
  }
  static void TearDownTestSuite() {
    if (cache_ != nullptr) ucs_rcache_destroy(cache_);
  }
  void SetUp() override {
    ASSERT_EQ(notify_rc_, RDMALLOC_OK) << "rdmalloc_notify_ucx: errno " << errno;
    ASSERT_NE(cache_, nullptr) << "ucs_rcache_create failed";
    ASSERT_TRUE(arena_.ok());
  }
  ucs_rcache_region_t* Get(void* p, size_t n) {
    ucs_rcache_region_t* r = nullptr;
    EXPECT_EQ(ucs_rcache_get(cache_, p, n, PROT_READ | PROT_WRITE, nullptr, &r), UCS_OK);
    return r;
  }

  static int notify_rc_;
  static ucs_rcache_t* cache_;
  PrivateArena arena_;
};
int UcxNotify::notify_rc_ = RDMALLOC_ENOTSUP;
ucs_rcache_t* UcxNotify::cache_ = nullptr;

// The test runs as documented (BUILD sets the environment), and UCX does not
// see munmap on its own: only ucm_vm_munmap() drops an entry.
TEST_F(UcxNotify, UcxHooksAreOff) {
  EXPECT_EQ(ucm_global_opts.enable_malloc_hooks, 0);
  EXPECT_EQ(ucm_global_opts.mmap_hook_mode, UCM_MMAP_HOOK_NONE);
  EXPECT_NE(ucm_global_opts.enable_events, 0);

  void* page = mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(page, MAP_FAILED);
  ucs_rcache_region_t* r = Get(page, 4096);
  ASSERT_NE(r, nullptr);
  ASSERT_EQ(munmap(page, 4096), 0);
  EXPECT_TRUE(Cached(r)) << "UCX saw munmap: its hooks are on";
  ucm_vm_munmap(page, 4096);
  EXPECT_FALSE(Cached(r));
  int deregs = g_deregs;
  ucs_rcache_region_put(cache_, r);
  EXPECT_EQ(g_deregs, deregs + 1);
}

// A buffer larger than RDMALLOC_REGION_SIZE (2 MiB here) has a region of its
// own, released as a whole once the buffer is freed and decay forced.
TEST_F(UcxNotify, EntryDroppedWhenRegionReleasedNotBefore) {
  constexpr size_t kSize = size_t{6} << 20;
  void* b = arena_.Alloc(kSize);
  ASSERT_NE(b, nullptr);
  memset(b, 1, kSize);
  Span region = RegionSpan(b);
  ASSERT_GE(region.len, kSize);
  int regs = g_regs;
  ucs_rcache_region_t* r = Get(b, kSize);
  ASSERT_NE(r, nullptr);
  EXPECT_EQ(g_regs, regs + 1);
  ucs_rcache_region_put(cache_, r);
  // Held again for the test, so the entry can be watched after invalidation.
  r = Get(b, kSize);
  EXPECT_EQ(g_regs, regs + 1) << "second get was not a cache hit";
  ASSERT_TRUE(Cached(r));

  uint64_t released = Stats().regions_released;
  free(b);  // jemalloc keeps it (RDMALLOC_DECAY_MS=-1): nothing is released
  Stats();
  EXPECT_TRUE(Cached(r)) << "dropped at free(), before rdmalloc released anything";
  EXPECT_EQ(Stats().regions_released, released);

  ForceDecay();
  EXPECT_TRUE(Eventually([&] { return !Cached(r); })) << "never dropped after the release";
  EXPECT_GT(Stats().regions_released, released);
  int deregs = g_deregs;
  ucs_rcache_region_put(cache_, r);
  EXPECT_EQ(g_deregs, deregs + 1);
}

// A region that still holds other buffers stays: the freed buffer's entry
// survives free() and forced decay. A dedicated buffer released in the same
// decay shows that its notification was delivered meanwhile.
TEST_F(UcxNotify, EntrySurvivesWhileRegionHoldsOtherBuffers) {
  constexpr size_t kSmall = 64 << 10, kLarge = size_t{6} << 20;
  void* p = arena_.Alloc(kSmall);
  void* q = arena_.Alloc(kSmall);
  void* b = arena_.Alloc(kLarge);
  ASSERT_TRUE(p != nullptr && q != nullptr && b != nullptr);
  memset(p, 2, kSmall);
  memset(q, 3, kSmall);
  memset(b, 4, kLarge);
  Span shared = RegionSpan(p);
  ASSERT_TRUE(shared.Contains(q)) << "p and q in different regions";
  ASSERT_FALSE(shared.Contains(b));
  ucs_rcache_region_t* rp = Get(p, kSmall);
  ucs_rcache_region_t* rb = Get(b, kLarge);
  ASSERT_TRUE(rp != nullptr && rb != nullptr);
  ASSERT_TRUE(Cached(rp) && Cached(rb));

  free(p);
  free(b);
  ForceDecay();
  ASSERT_TRUE(Eventually([&] { return !Cached(rb); })) << "control: b's release never arrived";
  EXPECT_TRUE(Cached(rp)) << "dropped while its region still holds q";
  EXPECT_EQ(RegionSpan(q), shared);

  ucs_rcache_region_put(cache_, rb);
  ucs_rcache_region_put(cache_, rp);
  free(q);
}

}  // namespace
}  // namespace rdmalloc_test
