// rdmalloc_notify_ucx: UCX's registration caches hear of released memory from
// rdmalloc rather than from UCX's own malloc and mmap hooks.
//
// UCX's caches (ucs_rcache) drop their entries on UCM_EVENT_VM_UNMAPPED. Once
// that event is external, adding a handler for it installs no hooks, and only
// ucm_vm_munmap() raises it: rdmalloc calls it for every range it releases.
#include <errno.h>
#include <pthread.h>

#include <ucm/api/ucm.h>

#include "allocator/rdmalloc.h"
#include "integrations/shared_library.h"

namespace {

using SetExternalEventFn = void (*)(int events);
using VmMunmapFn = void (*)(void* addr, size_t length);

VmMunmapFn g_vm_munmap = nullptr;  // set once, before the observer exists
bool g_enabled = false;
pthread_mutex_t g_enable_lock = PTHREAD_MUTEX_INITIALIZER;

// Never removed; addr NULL would be rdmalloc's last call after removal.
void TellUcx(void* addr, size_t len, void*) {
  if (addr != nullptr) g_vm_munmap(addr, len);
}

int Enable() {
  if (g_enabled) return RDMALLOC_OK;
  void* ucm = rdmalloc::OpenSharedLibrary("libucm.so.0");
  // libucm uses libucs symbols without naming libucs as a dependency: alone
  // it only loads into a process that has UCX already (not so when
  // RDMALLOC_NOTIFY runs this before main). Loading libucs brings both; it
  // stays loaded like libucm.
  if (ucm == nullptr && rdmalloc::OpenSharedLibrary("libucs.so.0") != nullptr)
    ucm = rdmalloc::OpenSharedLibrary("libucm.so.0");
  if (ucm == nullptr) {
    errno = ENOENT;
    return RDMALLOC_ENOTSUP;
  }
  auto set_external = reinterpret_cast<SetExternalEventFn>(dlsym(ucm, "ucm_set_external_event"));
  auto vm_munmap = reinterpret_cast<VmMunmapFn>(dlsym(ucm, "ucm_vm_munmap"));
  if (set_external == nullptr || vm_munmap == nullptr) {
    dlclose(ucm);
    errno = ENOSYS;
    return RDMALLOC_ENOTSUP;
  }
  g_vm_munmap = vm_munmap;
  int rc = rdmalloc_on_release(TellUcx, nullptr);
  if (rc != RDMALLOC_OK) {
    dlclose(ucm);
    return rc;
  }
  // libucm stays loaded from here on: the observer calls into it.
  set_external(UCM_EVENT_VM_UNMAPPED);
  g_enabled = true;
  return RDMALLOC_OK;
}

}  // namespace

extern "C" __attribute__((visibility("default"))) int rdmalloc_notify_ucx(void) {
  pthread_mutex_lock(&g_enable_lock);
  int rc = Enable();
  pthread_mutex_unlock(&g_enable_lock);
  return rc;
}
