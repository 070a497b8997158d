// Finding another library at run time, so that rdmalloc needs no link-time
// dependency on it.
#ifndef RDMALLOC_INTEGRATIONS_SHARED_LIBRARY_H_
#define RDMALLOC_INTEGRATIONS_SHARED_LIBRARY_H_

#include <dlfcn.h>

namespace rdmalloc {

// The copy of `soname` the process already has (also one loaded with
// RTLD_LOCAL, e.g. by an MPI component), else a fresh load: a later load of
// the same soname by the library's own users then resolves to that copy.
inline void* OpenSharedLibrary(const char* soname) {
  void* handle = dlopen(soname, RTLD_NOW | RTLD_NOLOAD);
  return handle != nullptr ? handle : dlopen(soname, RTLD_NOW | RTLD_GLOBAL);
}

}  // namespace rdmalloc

#endif  // RDMALLOC_INTEGRATIONS_SHARED_LIBRARY_H_
