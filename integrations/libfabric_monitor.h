// rdmalloc's releases as a libfabric memory monitor (struct fid_mem_monitor),
// the object rdmalloc_notify_libfabric() imports into libfabric.
#ifndef RDMALLOC_INTEGRATIONS_LIBFABRIC_MONITOR_H_
#define RDMALLOC_INTEGRATIONS_LIBFABRIC_MONITOR_H_

#include <rdma/fabric.h>
#include <rdma/fi_ext.h>

namespace rdmalloc {

// libfabric drives the monitor through fid.export_ops: start when its first
// MR cache opens, stop when the last one closes, subscribe for each entry it
// caches. Between start and stop rdmalloc calls fid.import_ops->notify (set by
// libfabric at import) for every range it releases. subscribe accepts only
// ranges inside rdmalloc's heap: for other memory nobody would tell the cache
// of an unmap, so libfabric keeps those registrations out of its cache.
struct ReleaseMonitor {
  fid_mem_monitor fid;  // first: libfabric passes &fid back to the ops
  fi_ops_mem_monitor ops;
};

// Fills in *m (fid class, export ops); import_ops stays NULL until imported.
void InitReleaseMonitor(ReleaseMonitor* m);

}  // namespace rdmalloc

#endif  // RDMALLOC_INTEGRATIONS_LIBFABRIC_MONITOR_H_
