// The ibverbs backend: ibv_reg_mr/ibv_dereg_mr per protection domain.
//
// libibverbs is loaded with dlopen when this backend is chosen, so programs
// that never touch RDMA do not load it, and tests can supply a fake VerbsApi.
#ifndef RDMALLOC_VERBS_VERBS_REGISTRAR_H_
#define RDMALLOC_VERBS_VERBS_REGISTRAR_H_

#include <memory>

#include "verbs/registrar.h"

struct ibv_device;
struct ibv_context;

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
};

// Fills *api from `library` (nullptr or empty: libibverbs.so.1). Returns 0 or
// an errno (ENOENT: not installed, ENOSYS: an entry point is missing).
int LoadVerbsApi(const char* library, VerbsApi* api);

// Number of RDMA devices the kernel exposes, read from sysfs without
// allocating (safe while malloc is being initialised).
int CountRdmaDevices();

// `device` (may be null or empty) picks the default domain's device by name.
std::unique_ptr<Registrar> MakeVerbsRegistrar(const VerbsApi& api, const char* device);

}  // namespace rdmalloc

#endif  // RDMALLOC_VERBS_VERBS_REGISTRAR_H_
