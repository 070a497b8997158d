#include "verbs/verbs_registrar.h"

#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <infiniband/verbs.h>

#include <cstdio>
#include <cstring>
#include <string>

namespace rdmalloc {
namespace {

class VerbsDomain final : public Domain {
 public:
  VerbsDomain(const VerbsApi& api, ibv_pd* pd, int access, ibv_context* owned_ctx, bool owns_pd)
      : api_(api), pd_(pd), access_(access), owned_ctx_(owned_ctx), owns_pd_(owns_pd) {}
  ~VerbsDomain() override {
    if (forked_) return;  // the parent's objects: not ours to free
    if (owns_pd_) api_.dealloc_pd(pd_);
    if (owned_ctx_ != nullptr) api_.close_device(owned_ctx_);
  }

  int Register(void* base, size_t len, Registration* out) override {
    // A fork child shares the parent's verbs context; registering through it
    // would act on the parent's objects.
    if (forked_) return EOPNOTSUPP;
    errno = 0;
    ibv_mr* mr = api_.reg_mr(pd_, base, len, access_);
    if (mr == nullptr) return errno != 0 ? errno : EIO;
    out->lkey = mr->lkey;
    out->rkey = mr->rkey;
    out->handle = mr;
    out->slots = 1;
    out->key_shift = 0;
    return 0;
  }

  int Deregister(void*, size_t, const Registration& reg) override {
    if (forked_) return 0;
    return api_.dereg_mr(static_cast<ibv_mr*>(reg.handle));
  }

  // RDMA through a loopback QP comes with the soft-RoCE suite; until then the
  // verbs backend has no data path of its own.
  int DmaWrite(const Registration&, const void*, void*, const void*, size_t) override {
    return ENOTSUP;
  }
  int DmaRead(const Registration&, const void*, const void*, void*, size_t) override {
    return ENOTSUP;
  }

  void ForgetAfterFork() override { forked_ = true; }
  void* handle() const override { return pd_; }

 private:
  const VerbsApi api_;
  ibv_pd* const pd_;
  const int access_;
  ibv_context* const owned_ctx_;
  const bool owns_pd_;
  bool forked_ = false;
};

class VerbsRegistrar final : public Registrar {
 public:
  VerbsRegistrar(const VerbsApi& api, const char* device)
      : api_(api), device_(device != nullptr ? device : "") {}
  const char* name() const override { return "verbs"; }
  const char* device_name() const override { return opened_; }
  // ibv_reg_mr/ibv_dereg_mr allocate (the MR object, fork-tracking nodes).
  bool hook_safe() const override { return false; }

  Domain* OpenDomain(ibv_pd* pd, int access, int* err) override {
    *err = 0;
    if (pd != nullptr) return new VerbsDomain(api_, pd, access, nullptr, false);
    int n = 0;
    ibv_device** list = api_.get_device_list(&n);
    if (list == nullptr) {
      *err = errno != 0 ? errno : ENODEV;
      return nullptr;
    }
    ibv_device* chosen = nullptr;
    for (int i = 0; i < n && chosen == nullptr; i++) {
      if (device_.empty() || device_ == api_.get_device_name(list[i])) chosen = list[i];
    }
    if (chosen != nullptr) {
      snprintf(opened_, sizeof opened_, "%s", api_.get_device_name(chosen));
    }
    errno = 0;
    ibv_context* ctx = chosen != nullptr ? api_.open_device(chosen) : nullptr;
    int open_err = errno;
    api_.free_device_list(list);
    if (ctx == nullptr) {
      *err = chosen == nullptr ? ENODEV : (open_err != 0 ? open_err : EIO);
      return nullptr;
    }
    errno = 0;
    ibv_pd* own_pd = api_.alloc_pd(ctx);
    if (own_pd == nullptr) {
      *err = errno != 0 ? errno : EIO;
      api_.close_device(ctx);
      return nullptr;
    }
    return new VerbsDomain(api_, own_pd, access, ctx, true);
  }

 private:
  const VerbsApi api_;
  const std::string device_;
  char opened_[64] = {};
};

template <typename F>
bool Bind(void* lib, const char* name, F* fn) {
  *fn = reinterpret_cast<F>(dlsym(lib, name));
  return *fn != nullptr;
}

}  // namespace

int LoadVerbsApi(const char* library, VerbsApi* api) {
  if (library == nullptr || library[0] == '\0') library = "libibverbs.so.1";
  void* lib = dlopen(library, RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) return ENOENT;
  bool ok = Bind(lib, "ibv_get_device_list", &api->get_device_list) &&
            Bind(lib, "ibv_free_device_list", &api->free_device_list) &&
            Bind(lib, "ibv_get_device_name", &api->get_device_name) &&
            Bind(lib, "ibv_open_device", &api->open_device) &&
            Bind(lib, "ibv_close_device", &api->close_device) &&
            Bind(lib, "ibv_alloc_pd", &api->alloc_pd) &&
            Bind(lib, "ibv_dealloc_pd", &api->dealloc_pd) &&
            Bind(lib, "ibv_reg_mr", &api->reg_mr) &&
            Bind(lib, "ibv_dereg_mr", &api->dereg_mr);
  return ok ? 0 : ENOSYS;  // the library stays loaded: its functions are in use
}

int CountRdmaDevices() {
  int fd = open("/sys/class/infiniband", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return 0;
  alignas(8) char buf[4096];
  int count = 0;
  for (;;) {
    long n = syscall(SYS_getdents64, fd, buf, sizeof buf);
    if (n <= 0) break;
    for (long off = 0; off < n;) {
      auto* d = reinterpret_cast<struct dirent64*>(buf + off);
      if (d->d_name[0] != '.') count++;
      off += d->d_reclen;
    }
  }
  close(fd);
  return count;
}

std::unique_ptr<Registrar> MakeVerbsRegistrar(const VerbsApi& api, const char* device) {
  return std::make_unique<VerbsRegistrar>(api, device);
}

}  // namespace rdmalloc
