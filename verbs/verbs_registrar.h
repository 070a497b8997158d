// The ibverbs backend: ibv_reg_mr/ibv_dereg_mr per protection domain.
//
// libibverbs is loaded with dlopen when this backend is chosen, so programs
// that never touch RDMA do not load it, and tests can supply a fake VerbsApi.
#ifndef RDMALLOC_VERBS_VERBS_REGISTRAR_H_
#define RDMALLOC_VERBS_VERBS_REGISTRAR_H_

#include <cstdint>
#include <memory>

#include "verbs/registrar.h"

struct ibv_device;
struct ibv_context;
struct ibv_comp_channel;
struct ibv_cq;
struct ibv_qp;
struct ibv_qp_init_attr;
struct ibv_qp_attr;
struct ibv_port_attr;
struct ibv_send_wr;
struct ibv_wc;
union ibv_gid;

namespace rdmalloc {

// The libibverbs entry points this backend uses.
struct VerbsApi {
  ibv_device** (*get_device_list)(int* num) = nullptr;
  void (*free_device_list)(ibv_device** list) = nullptr;
  const char* (*get_device_name)(ibv_device* dev) = nullptr;
  ibv_context* (*open_device)(ibv_device* dev) = nullptr;
  int (*close_device)(ibv_context* ctx) = nullptr;
  ibv_pd* (*alloc_pd)(ibv_context* ctx) = nullptr;
  int (*dealloc_pd)(ibv_pd* pd) = nullptr;
  ibv_mr* (*reg_mr)(ibv_pd* pd, void* addr, size_t length, int access) = nullptr;
  int (*dereg_mr)(ibv_mr* mr) = nullptr;
  // Optional. libibverbs' ibv_reg_mr calls ibv_reg_mr_iova2 through its PLT,
  // which a preloaded rdmalloc interposes (allocator/verbs_interpose.cc):
  // rdmalloc's own registrations call this one directly when it exists.
  ibv_mr* (*reg_mr_iova2)(ibv_pd* pd, void* addr, size_t length, uint64_t iova,
                          unsigned access) = nullptr;
  ibv_mr* RegMr(ibv_pd* pd, void* addr, size_t length, int access) const {
    if (reg_mr_iova2 != nullptr)
      return reg_mr_iova2(pd, addr, length, reinterpret_cast<uintptr_t>(addr),
                          static_cast<unsigned>(access));
    return reg_mr(pd, addr, length, access);
  }

  // The data path (rdmalloc_dma_*): a loopback RC QP per domain. Optional:
  // LoadVerbsApi leaves all of them null when any is missing, and then
  // Domain::DmaWrite/DmaRead return ENOTSUP.
  ibv_cq* (*create_cq)(ibv_context* ctx, int cqe, void* cq_context, ibv_comp_channel* channel,
                       int comp_vector) = nullptr;
  int (*destroy_cq)(ibv_cq* cq) = nullptr;
  ibv_qp* (*create_qp)(ibv_pd* pd, ibv_qp_init_attr* attr) = nullptr;
  int (*destroy_qp)(ibv_qp* qp) = nullptr;
  int (*modify_qp)(ibv_qp* qp, ibv_qp_attr* attr, int attr_mask) = nullptr;
  // The exported ibv_query_port (verbs.h wraps it in an inline of the same
  // name); the caller zeroes *attr first, as that inline does.
  int (*query_port)(ibv_context* ctx, uint8_t port, ibv_port_attr* attr) = nullptr;
  int (*query_gid)(ibv_context* ctx, uint8_t port, int index, ibv_gid* gid) = nullptr;
  // ibv_post_send and ibv_poll_cq are static inline in verbs.h (provider ops
  // of the context); LoadVerbsApi points these at functions that call them.
  int (*post_send)(ibv_qp* qp, ibv_send_wr* wr, ibv_send_wr** bad_wr) = nullptr;
  int (*poll_cq)(ibv_cq* cq, int num_entries, ibv_wc* wc) = nullptr;

  // Not an entry point: how long a DMA waits for its completion before it
  // gives up with ETIMEDOUT (tests shorten it).
  int dma_timeout_ms = 10000;
};

// Fills *api from `library` (nullptr or empty: libibverbs.so.1). Returns 0 or
// an errno (ENOENT: not installed, ENOSYS: a registration entry point is
// missing). Missing data-path entry points are not an error (see above).
int LoadVerbsApi(const char* library, VerbsApi* api);

// Number of RDMA devices the kernel exposes, read from sysfs without
// allocating (safe while malloc is being initialised).
int CountRdmaDevices();

// `device` (may be null or empty) picks the default domain's device by name.
std::unique_ptr<Registrar> MakeVerbsRegistrar(const VerbsApi& api, const char* device);

}  // namespace rdmalloc

#endif  // RDMALLOC_VERBS_VERBS_REGISTRAR_H_
