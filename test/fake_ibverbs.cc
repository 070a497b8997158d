// A stand-in libibverbs for tests on machines without an RDMA device. Like the
// real library (the MR object, the fork-protection tree) it calls malloc and
// free inside ibv_reg_mr and ibv_dereg_mr, so the heap's promise never to call
// a verbs function from jemalloc's hook context is exercised for real. It
// "pins" with mlock, so registration shows in VmLck.
#include <infiniband/verbs.h>
#include <sys/mman.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <vector>

#undef ibv_reg_mr
#undef ibv_reg_mr_iova

namespace {
std::atomic<int> g_live_mrs{0};
std::atomic<int> g_reg_calls{0};  // kernel registrations, as the test counts them
std::atomic<uint32_t> g_next_key{100};
ibv_device g_device;

// Allocation churn of the kind a provider does around a registration.
void Churn() {
  std::vector<void*> v;
  for (int i = 0; i < 8; i++) v.push_back(malloc(24 + 200 * i));
  for (void* p : v) free(p);
}
}  // namespace

extern "C" {

__attribute__((visibility("default"))) int fake_ibverbs_live_mrs() { return g_live_mrs.load(); }
__attribute__((visibility("default"))) int fake_ibverbs_reg_calls() { return g_reg_calls.load(); }

ibv_device** ibv_get_device_list(int* num) {
  auto** list = static_cast<ibv_device**>(calloc(2, sizeof(ibv_device*)));
  strcpy(g_device.name, "fake0");
  list[0] = &g_device;
  if (num != nullptr) *num = 1;
  return list;
}

void ibv_free_device_list(ibv_device** list) { free(list); }

const char* ibv_get_device_name(ibv_device* dev) { return dev->name; }

ibv_context* ibv_open_device(ibv_device* dev) {
  auto* ctx = static_cast<ibv_context*>(calloc(1, sizeof(ibv_context)));
  ctx->device = dev;
  return ctx;
}

int ibv_close_device(ibv_context* ctx) {
  free(ctx);
  return 0;
}

ibv_pd* ibv_alloc_pd(ibv_context* ctx) {
  auto* pd = static_cast<ibv_pd*>(calloc(1, sizeof(ibv_pd)));
  pd->context = ctx;
  return pd;
}

int ibv_dealloc_pd(ibv_pd* pd) {
  free(pd);
  return 0;
}

ibv_mr* ibv_reg_mr_iova2(ibv_pd* pd, void* addr, size_t length, uint64_t iova, unsigned access) {
  (void)iova;
  (void)access;
  Churn();
  if (pd == nullptr || length == 0) {
    errno = EINVAL;
    return nullptr;
  }
  if (mlock(addr, length) != 0) return nullptr;  // errno from mlock
  auto* mr = static_cast<ibv_mr*>(calloc(1, sizeof(ibv_mr)));
  mr->context = pd->context;
  mr->pd = pd;
  mr->addr = addr;
  mr->length = length;
  mr->handle = static_cast<uint32_t>(g_reg_calls.fetch_add(1) + 1);
  mr->lkey = g_next_key.fetch_add(1);
  mr->rkey = mr->lkey | 0x80000000u;
  g_live_mrs++;
  return mr;
}

// As libibverbs: through ibv_reg_mr_iova2 (which an interposer may replace).
ibv_mr* ibv_reg_mr(ibv_pd* pd, void* addr, size_t length, int access) {
  return ibv_reg_mr_iova2(pd, addr, length, reinterpret_cast<uintptr_t>(addr),
                          static_cast<unsigned>(access));
}

ibv_mr* ibv_reg_mr_iova(ibv_pd* pd, void* addr, size_t length, uint64_t iova, int access) {
  return ibv_reg_mr_iova2(pd, addr, length, iova, static_cast<unsigned>(access));
}

int ibv_rereg_mr(ibv_mr* mr, int flags, ibv_pd* pd, void* addr, size_t length, int access) {
  (void)access;
  if ((flags & ~IBV_REREG_MR_FLAGS_SUPPORTED) != 0 ||
      ((flags & IBV_REREG_MR_CHANGE_TRANSLATION) && (length == 0 || addr == nullptr))) {
    errno = EINVAL;
    return IBV_REREG_MR_ERR_INPUT;
  }
  if (flags & IBV_REREG_MR_CHANGE_TRANSLATION) {
    if (mlock(addr, length) != 0) return IBV_REREG_MR_ERR_CMD;
    munlock(mr->addr, mr->length);
    mr->addr = addr;
    mr->length = length;
  }
  if (flags & IBV_REREG_MR_CHANGE_PD) mr->pd = pd;
  mr->lkey = g_next_key.fetch_add(1);
  mr->rkey = mr->lkey | 0x80000000u;
  return 0;
}

int ibv_dereg_mr(ibv_mr* mr) {
  Churn();
  if (munlock(mr->addr, mr->length) != 0) return errno;
  free(mr);
  g_live_mrs--;
  return 0;
}

}  // extern "C"
