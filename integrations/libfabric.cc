// rdmalloc_notify_libfabric: libfabric's MR caches hear of released memory
// from rdmalloc, through an imported memory monitor, instead of from
// libfabric's memhooks or userfaultfd monitors.
#include <errno.h>
#include <pthread.h>

#include <rdma/fi_errno.h>

#include "allocator/rdmalloc.h"
#include "integrations/libfabric_monitor.h"
#include "integrations/shared_library.h"

namespace rdmalloc {
namespace {

// addr NULL: rdmalloc's last call after Stop; the monitor is rdmalloc's own,
// nothing to free.
void Notify(void* addr, size_t len, void* arg) {
  if (addr == nullptr) return;
  auto* monitor = static_cast<fid_mem_monitor*>(arg);
  monitor->import_ops->notify(monitor, addr, len);
}

int Start(fid_mem_monitor* monitor) {
  return rdmalloc_on_release(Notify, monitor) == RDMALLOC_OK ? 0 : -FI_ENOSPC;
}

// Never waits for a running Notify: one under way may still reach the
// monitor's (by then empty) list of caches, which is harmless.
void Stop(fid_mem_monitor* monitor) { rdmalloc_on_release_remove(Notify, monitor); }

// Runs under libfabric's monitor lock, which Notify takes: rdmalloc_owns
// takes no lock at all.
int Subscribe(fid_mem_monitor*, const void* addr, size_t len) {
  return rdmalloc_owns(addr, len) ? 0 : -FI_EINVAL;
}

// Notifications come per released region, not per subscription: nothing to undo.
void Unsubscribe(fid_mem_monitor*, const void*, size_t) {}

// A subscribed range stays valid until its release is notified.
bool Valid(fid_mem_monitor*, const void*, size_t) { return true; }

ReleaseMonitor g_monitor;
bool g_imported = false;
pthread_mutex_t g_import_lock = PTHREAD_MUTEX_INITIALIZER;

using FiOpenFn = int (*)(uint32_t version, const char* name, void* attr, size_t attr_len,
                         uint64_t flags, fid** fid, void* context);

// fi_import() from <rdma/fi_ext.h>, with fi_open looked up at run time.
int Import() {
  if (g_imported) return RDMALLOC_OK;
  void* fabric = OpenSharedLibrary("libfabric.so.1");
  if (fabric == nullptr) {
    errno = ENOENT;
    return RDMALLOC_ENOTSUP;
  }
  auto fi_open_fn = reinterpret_cast<FiOpenFn>(dlsym(fabric, "fi_open"));
  int ret = -FI_ENOSYS;
  if (fi_open_fn != nullptr) {
    InitReleaseMonitor(&g_monitor);
    fid* cache = nullptr;
    // 1.13 introduced importing monitors.
    ret = fi_open_fn(FI_VERSION(1, 13), "mr_cache", nullptr, 0, 0, &cache, nullptr);
    if (ret == 0) {
      ret = fi_import_fid(cache, &g_monitor.fid.fid, 0);
      fi_close(cache);
    }
  }
  if (ret != 0) {
    dlclose(fabric);
    errno = -ret;  // FI_E* equal errno values (EBUSY: a monitor is already in use)
    return RDMALLOC_ENOTSUP;
  }
  // libfabric stays loaded from here on: it holds our monitor.
  g_imported = true;
  return RDMALLOC_OK;
}

}  // namespace

void InitReleaseMonitor(ReleaseMonitor* m) {
  *m = ReleaseMonitor{};
  m->ops.size = sizeof m->ops;
  m->ops.start = Start;
  m->ops.stop = Stop;
  m->ops.subscribe = Subscribe;
  m->ops.unsubscribe = Unsubscribe;
  m->ops.valid = Valid;
  m->fid.fid.fclass = FI_CLASS_MEM_MONITOR;
  m->fid.export_ops = &m->ops;
}

}  // namespace rdmalloc

extern "C" __attribute__((visibility("default"))) int rdmalloc_notify_libfabric(void) {
  pthread_mutex_lock(&rdmalloc::g_import_lock);
  int rc = rdmalloc::Import();
  pthread_mutex_unlock(&rdmalloc::g_import_lock);
  return rc;
}
