// RDMALLOC_NOTIFY=ucx,libfabric: for programs that cannot call
// rdmalloc_notify_* themselves (an unmodified MPI application with rdmalloc
// preloaded). Done when the library loads, before main and before UCX or
// libfabric make their caches, and not inside malloc's initialisation:
// opening those libraries allocates.
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "allocator/config.h"
#include "allocator/log.h"
#include "allocator/rdmalloc.h"

extern char** environ;

namespace rdmalloc {
namespace {

void Ignore(const char*) {}  // problems were reported when malloc started

void Complain(const char* cache, int rc) {
  char line[256];
  int n = snprintf(line, sizeof line,
                   "rdmalloc: RDMALLOC_NOTIFY=%s: cannot notify it (%d, errno %d: %s); its cache "
                   "needs its own memory hooks\n",
                   cache, rc, errno, strerror(errno));
  ssize_t ignored = write(STDERR_FILENO, line, n > 0 ? static_cast<size_t>(n) : 0);
  (void)ignored;
}

__attribute__((constructor)) void NotifyFromEnv() {
  int notify = ParseEnvironment(environ, Ignore).notify;
  if (notify & kNotifyUcx) {
    int rc = rdmalloc_notify_ucx();
    if (rc != RDMALLOC_OK) Complain("ucx", rc);
    else Log(1, "UCX hears of released memory from rdmalloc (RDMALLOC_NOTIFY)");
  }
  if (notify & kNotifyLibfabric) {
    int rc = rdmalloc_notify_libfabric();
    if (rc != RDMALLOC_OK) Complain("libfabric", rc);
    else Log(1, "libfabric hears of released memory from rdmalloc (RDMALLOC_NOTIFY)");
  }
}

}  // namespace
}  // namespace rdmalloc
