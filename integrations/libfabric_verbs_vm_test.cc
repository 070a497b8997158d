// In the soft-RoCE VM: libfabric's verbs provider keeps registrations of
// rdmalloc buffers in its MR cache, watched by rdmalloc's imported monitor.
// The entry survives free() and reuse of the buffer (rdmalloc keeps the
// region, unpurged) and is gone once rdmalloc releases the region: fresh
// memory mapped at the same address then gets a registration of its own. A
// monitor that never notifies (the negative control, in a child process:
// libfabric takes one imported monitor per process) hands the stale entry out.
#include <gtest/gtest.h>
#include <sys/mman.h>

#include <cstring>

#include <rdma/fabric.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_errno.h>

#include "integrations/libfabric_monitor.h"
#include "integrations/notify_test_util.h"

namespace rdmalloc_test {
namespace {

constexpr size_t kSize = size_t{6} << 20;  // > RDMALLOC_REGION_SIZE: a region of its own
constexpr uint64_t kAccess = FI_SEND | FI_RECV | FI_READ | FI_WRITE | FI_REMOTE_READ | FI_REMOTE_WRITE;

struct Verbs {
  fi_info* info = nullptr;
  fid_fabric* fabric = nullptr;
  fid_domain* domain = nullptr;

  // The first verbs domain (rxe0); its MR cache starts the imported monitor.
  bool Open() {
    fi_info* hints = fi_allocinfo();
    hints->fabric_attr->prov_name = strdup("verbs");
    hints->ep_attr->type = FI_EP_MSG;
    hints->caps = FI_MSG | FI_RMA;
    hints->domain_attr->mr_mode = FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY;
    int ret = fi_getinfo(FI_VERSION(1, 13), nullptr, nullptr, 0, hints, &info);
    fi_freeinfo(hints);
    if (ret != 0) {
      fprintf(stderr, "fi_getinfo(verbs): %s\n", fi_strerror(-ret));
      return false;
    }
    ret = fi_fabric(info->fabric_attr, &fabric, nullptr);
    if (ret == 0) ret = fi_domain(fabric, info, &domain, nullptr);
    if (ret != 0) fprintf(stderr, "fi_fabric/fi_domain: %s\n", fi_strerror(-ret));
    return ret == 0;
  }
  ~Verbs() {
    if (domain != nullptr) fi_close(&domain->fid);
    if (fabric != nullptr) fi_close(&fabric->fid);
    if (info != nullptr) fi_freeinfo(info);
  }
  fid_mr* Reg(void* p) {
    fid_mr* mr = nullptr;
    int ret = fi_mr_reg(domain, p, kSize, kAccess, 0, 0, 0, &mr, nullptr);
    EXPECT_EQ(ret, 0) << fi_strerror(-ret);
    return mr;
  }
};

// Registers a buffer, frees and reuses it, has rdmalloc release its region
// and maps fresh memory there. Returns whether the last registration was the
// first one's cache entry (stale). started_observers: rdmalloc's observer
// count once the domain is open.
void Scenario(bool* stale, uint64_t* started_observers) {
  Verbs v;
  ASSERT_TRUE(v.Open());
  *started_observers = Stats().observers;
  PrivateArena arena;
  ASSERT_TRUE(arena.ok());

  void* b = arena.Alloc(kSize);
  ASSERT_NE(b, nullptr);
  memset(b, 1, kSize);
  fid_mr* first = v.Reg(b);
  ASSERT_NE(first, nullptr);
  uint64_t key = fi_mr_key(first);
  fi_close(&first->fid);  // back to the cache, still registered

  free(b);  // kept by jemalloc (RDMALLOC_DECAY_MS=-1) and not purged
  void* again = arena.Alloc(kSize);
  ASSERT_EQ(again, b) << "jemalloc did not hand the kept extent back";
  fid_mr* hit = v.Reg(again);
  EXPECT_EQ(hit, first) << "entry lost at free(), before rdmalloc released anything";
  EXPECT_EQ(fi_mr_key(hit), key);
  fi_close(&hit->fid);
  free(again);

  uint64_t released = Stats().regions_released;
  ForceDecay();
  ASSERT_TRUE(Eventually([&] { return Stats().regions_released > released; }));
  void* fresh = mmap(b, kSize, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
  ASSERT_EQ(fresh, b);
  memset(fresh, 2, kSize);
  fid_mr* after = v.Reg(fresh);
  ASSERT_NE(after, nullptr);
  *stale = fi_mr_key(after) == key;
  fi_close(&after->fid);
  munmap(fresh, kSize);
}

// Accepts subscriptions but never tells libfabric anything.
int DeafStart(fid_mem_monitor*) { return 0; }
void DeafStop(fid_mem_monitor*) {}

TEST(LibfabricVerbs, CacheEntryDroppedWhenRegionReleased) {
  if (IsRerunChild()) {
    rdmalloc::ReleaseMonitor deaf;
    rdmalloc::InitReleaseMonitor(&deaf);
    deaf.ops.start = DeafStart;
    deaf.ops.stop = DeafStop;
    ASSERT_EQ(fi_import(FI_VERSION(1, 13), "mr_cache", nullptr, 0, 0, &deaf.fid.fid, nullptr), 0);
    bool stale = false;
    uint64_t observers = 0;
    Scenario(&stale, &observers);
    if (HasFatalFailure()) return;
    // Exit 3: the stale entry came back, as it must without notifications.
    if (!HasFailure() && stale) _exit(3);
    return;
  }
  uint64_t observers_before = Stats().observers;
  ASSERT_EQ(rdmalloc_notify_libfabric(), RDMALLOC_OK) << "errno " << errno;
  bool stale = true;
  uint64_t observers = 0;
  Scenario(&stale, &observers);
  if (HasFatalFailure()) return;
  EXPECT_EQ(observers, observers_before + 1) << "libfabric did not start rdmalloc's monitor";
  EXPECT_FALSE(stale) << "libfabric handed out a registration of unmapped memory";
  EXPECT_EQ(RerunSelf("LibfabricVerbs.CacheEntryDroppedWhenRegionReleased", {}), 3)
      << "negative control: a deaf monitor's cache did not return the stale entry";
}

}  // namespace
}  // namespace rdmalloc_test
