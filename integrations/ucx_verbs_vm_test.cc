// In the soft-RoCE VM: UCP over RC verbs on rxe0, UCX's memory hooks off. UCX's
// IB registration cache keeps the registration of an rdmalloc buffer across
// free() and reuse (ucp_mem_map hands out the same rkey) and drops it once
// rdmalloc releases the region: fresh memory mapped at the same address gets a
// new rkey. Negative control (a child process): with the event external but
// nobody raising it, UCX hands out the stale rkey.
#include <gtest/gtest.h>
#include <sys/mman.h>

#include <cstring>
#include <string>

#include <ucm/api/ucm.h>
#include <ucp/api/ucp.h>

#include "integrations/notify_test_util.h"

namespace rdmalloc_test {
namespace {

constexpr size_t kSize = size_t{6} << 20;  // > RDMALLOC_REGION_SIZE: a region of its own

struct Ucp {
  ucp_context_h context = nullptr;

  bool Init() {
    ucp_config_t* config = nullptr;
    if (ucp_config_read(nullptr, nullptr, &config) != UCS_OK) return false;
    ucp_params_t params;
    memset(&params, 0, sizeof params);
    params.field_mask = UCP_PARAM_FIELD_FEATURES;
    params.features = UCP_FEATURE_RMA;
    ucs_status_t status = ucp_init(&params, config, &context);
    ucp_config_release(config);
    if (status != UCS_OK) fprintf(stderr, "ucp_init: %s\n", ucs_status_string(status));
    return status == UCS_OK;
  }
  ~Ucp() {
    if (context != nullptr) ucp_cleanup(context);
  }
  // Registers [p, p+kSize) and returns its packed rkey (all memory domains).
  std::string RkeyOf(void* p) {
    ucp_mem_map_params_t params;
    memset(&params, 0, sizeof params);
    params.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH;
    params.address = p;
    params.length = kSize;
    ucp_mem_h memh = nullptr;
    ucs_status_t status = ucp_mem_map(context, &params, &memh);
    EXPECT_EQ(status, UCS_OK) << ucs_status_string(status);
    if (status != UCS_OK) return {};
    void* buf = nullptr;
    size_t size = 0;
    std::string rkey;
    if (ucp_rkey_pack(context, memh, &buf, &size) == UCS_OK) {
      rkey.assign(static_cast<char*>(buf), size);
      ucp_rkey_buffer_release(buf);
    }
    ucp_mem_unmap(context, memh);  // the registration stays in UCX's cache
    return rkey;
  }
};

// Returns whether the registration of fresh memory at a released buffer's
// address was the old one (stale).
void Scenario(bool* stale) {
  Ucp ucp;
  ASSERT_TRUE(ucp.Init());
  PrivateArena arena;
  ASSERT_TRUE(arena.ok());

  void* b = arena.Alloc(kSize);
  ASSERT_NE(b, nullptr);
  memset(b, 1, kSize);
  std::string first = ucp.RkeyOf(b);
  ASSERT_FALSE(first.empty());

  free(b);  // kept by jemalloc (RDMALLOC_DECAY_MS=-1) and not purged
  void* again = arena.Alloc(kSize);
  ASSERT_EQ(again, b) << "jemalloc did not hand the kept extent back";
  EXPECT_EQ(ucp.RkeyOf(again), first) << "registration lost at free(), before any release";
  free(again);

  uint64_t released = Stats().regions_released;
  ForceDecay();
  ASSERT_TRUE(Eventually([&] { return Stats().regions_released > released; }));
  void* fresh = mmap(b, kSize, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
  ASSERT_EQ(fresh, b);
  memset(fresh, 2, kSize);
  *stale = ucp.RkeyOf(fresh) == first;
  munmap(fresh, kSize);
}

TEST(UcxVerbs, RegistrationDroppedWhenRegionReleased) {
  ASSERT_EQ(ucm_global_opts.enable_malloc_hooks, 0);
  ASSERT_EQ(ucm_global_opts.mmap_hook_mode, UCM_MMAP_HOOK_NONE);
  if (IsRerunChild()) {
    ucm_set_external_event(UCM_EVENT_VM_UNMAPPED);  // as rdmalloc does, minus the calls
    bool stale = false;
    Scenario(&stale);
    if (HasFatalFailure()) return;
    if (!HasFailure() && stale) _exit(3);  // the stale rkey came back
    return;
  }
  ASSERT_EQ(rdmalloc_notify_ucx(), RDMALLOC_OK) << "errno " << errno;
  bool stale = true;
  Scenario(&stale);
  if (HasFatalFailure()) return;
  EXPECT_FALSE(stale) << "UCX handed out a registration of unmapped memory";
  EXPECT_EQ(RerunSelf("UcxVerbs.RegistrationDroppedWhenRegionReleased", {}), 3)
      << "negative control: without notifications UCX did not return the stale rkey";
}

}  // namespace
}  // namespace rdmalloc_test
