#include "allocator/log.h"

#include <stdarg.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>

#include "allocator/startup_data.h"

namespace rdmalloc {
namespace {
RDMALLOC_STARTUP_DATA int g_verbose = 0;  // set at every start
}  // namespace

void SetLogLevel(int verbose) { g_verbose = verbose; }

void Log(int level, const char* format, ...) {
  if (g_verbose < level) return;
  char line[512];
  int n = snprintf(line, sizeof line, "rdmalloc[%d]: ", getpid());
  va_list ap;
  va_start(ap, format);
  int m = vsnprintf(line + n, sizeof line - n - 1, format, ap);
  va_end(ap);
  size_t len = static_cast<size_t>(n) + (m < 0 ? 0 : std::min<size_t>(m, sizeof line - n - 2));
  line[len++] = '\n';
  ssize_t ignored = write(STDERR_FILENO, line, len);
  (void)ignored;
}

uint64_t NowNs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return uint64_t(ts.tv_sec) * 1000000000u + uint64_t(ts.tv_nsec);
}

}  // namespace rdmalloc
