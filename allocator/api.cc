// The public C API (allocator/rdmalloc.h) and the exit report.
#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>

#include "allocator/heap.h"
#include "allocator/init.h"
#include "allocator/rdmalloc.h"

#define RDMALLOC_EXPORT extern "C" __attribute__((visibility("default")))

using rdmalloc::EnsureInitialised;
using rdmalloc::TheHeap;

RDMALLOC_EXPORT int rdmalloc_lookup(const void* addr, size_t len, struct ibv_pd* pd,
                                    struct rdmalloc_keys* out) {
  EnsureInitialised();
  return TheHeap().Lookup(addr, len, pd, out);
}

RDMALLOC_EXPORT int rdmalloc_add_pd(struct ibv_pd* pd, int access) {
  EnsureInitialised();
  return TheHeap().AddDomain(pd, access);
}

RDMALLOC_EXPORT int rdmalloc_remove_pd(struct ibv_pd* pd) {
  EnsureInitialised();
  return TheHeap().RemoveDomain(pd);
}

RDMALLOC_EXPORT const char* rdmalloc_backend(void) {
  EnsureInitialised();
  return TheHeap().BackendName();
}

RDMALLOC_EXPORT int rdmalloc_dma_write(const struct rdmalloc_keys* k, size_t off, const void* src,
                                       size_t n) {
  EnsureInitialised();
  return TheHeap().Dma(k, off, const_cast<void*>(src), n, /*to_memory=*/true);
}

RDMALLOC_EXPORT int rdmalloc_dma_read(const struct rdmalloc_keys* k, size_t off, void* dst,
                                      size_t n) {
  EnsureInitialised();
  return TheHeap().Dma(k, off, dst, n, /*to_memory=*/false);
}

RDMALLOC_EXPORT int rdmalloc_stats(struct rdmalloc_stats* out, size_t size) {
  EnsureInitialised();
  return TheHeap().Stats(out, size);
}

namespace {

double Mib(uint64_t bytes) { return static_cast<double>(bytes) / (1 << 20); }
double AvgUs(uint64_t ns, uint64_t calls) { return calls ? ns / 1000.0 / calls : 0.0; }

// The report is built on the stack and written with write(2): at exit the
// heap may already be half torn down by other destructors.
__attribute__((destructor)) void ExitReport() {
  if (rdmalloc::g_init_state.load() != rdmalloc::kReady) return;
  const rdmalloc::Config& c = TheHeap().config();
  if (c.stats == rdmalloc::StatsMode::kOff) return;
  struct rdmalloc_stats s;
  TheHeap().Stats(&s, sizeof s);
  const char* backend = TheHeap().BackendName();
  char buf[2048];
  int n;
  if (c.stats == rdmalloc::StatsMode::kJson) {
    n = snprintf(buf, sizeof buf,
                 "{\"rdmalloc\":1,\"pid\":%d,\"backend\":\"%s\",\"register\":\"%s\","
                 "\"regions_live\":%llu,\"regions_created\":%llu,\"regions_released\":%llu,"
                 "\"bytes_mapped\":%llu,\"bytes_in_use\":%llu,\"bytes_registered\":%llu,"
                 "\"domains\":%llu,\"reg_calls\":%llu,\"reg_ns\":%llu,\"dereg_calls\":%llu,"
                 "\"dereg_ns\":%llu,\"reg_failures\":%llu,\"lookups\":%llu,\"lookup_slow\":%llu,"
                 "\"lookup_not_ours\":%llu,\"lookup_cross\":%llu,\"lookup_reg_failed\":%llu,"
                 "\"lookup_einval\":%llu,\"foreign_extents\":%llu}\n",
                 getpid(), backend, c.register_mode == rdmalloc::RegisterMode::kEager ? "eager" : "lazy",
                 (unsigned long long)s.regions_live, (unsigned long long)s.regions_created,
                 (unsigned long long)s.regions_released, (unsigned long long)s.bytes_mapped,
                 (unsigned long long)s.bytes_in_use, (unsigned long long)s.bytes_registered,
                 (unsigned long long)s.domains, (unsigned long long)s.reg_calls,
                 (unsigned long long)s.reg_ns, (unsigned long long)s.dereg_calls,
                 (unsigned long long)s.dereg_ns, (unsigned long long)s.reg_failures,
                 (unsigned long long)s.lookups, (unsigned long long)s.lookup_slow,
                 (unsigned long long)s.lookup_not_ours, (unsigned long long)s.lookup_cross,
                 (unsigned long long)s.lookup_reg_failed, (unsigned long long)s.lookup_einval,
                 (unsigned long long)s.foreign_extents);
  } else {
    n = snprintf(
        buf, sizeof buf,
        "rdmalloc report (pid %d)\n"
        "  backend      %s, %s registration, %llu domain(s)\n"
        "  regions      %llu live, %llu created, %llu released\n"
        "  memory       %.1f MiB mapped, %.1f MiB in use by jemalloc, %.1f MiB registered\n"
        "  registration %llu reg (avg %.1f us), %llu dereg (avg %.1f us), %llu failed\n"
        "  lookups      %llu (%llu registered first; misses: %llu not ours, %llu crossing, "
        "%llu reg failed, %llu bad args)\n",
        getpid(), backend, c.register_mode == rdmalloc::RegisterMode::kEager ? "eager" : "lazy",
        (unsigned long long)s.domains, (unsigned long long)s.regions_live,
        (unsigned long long)s.regions_created, (unsigned long long)s.regions_released,
        Mib(s.bytes_mapped), Mib(s.bytes_in_use), Mib(s.bytes_registered),
        (unsigned long long)s.reg_calls, AvgUs(s.reg_ns, s.reg_calls),
        (unsigned long long)s.dereg_calls, AvgUs(s.dereg_ns, s.dereg_calls),
        (unsigned long long)s.reg_failures, (unsigned long long)s.lookups,
        (unsigned long long)s.lookup_slow, (unsigned long long)s.lookup_not_ours,
        (unsigned long long)s.lookup_cross, (unsigned long long)s.lookup_reg_failed,
        (unsigned long long)s.lookup_einval);
  }
  if (n <= 0) return;
  size_t len = static_cast<size_t>(n) < sizeof buf ? static_cast<size_t>(n) : sizeof buf - 1;
  int fd = STDERR_FILENO;
  if (c.stats_file[0] != '\0') fd = open(c.stats_file, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) return;
  ssize_t ignored = write(fd, buf, len);
  (void)ignored;
  if (fd != STDERR_FILENO) close(fd);
}

}  // namespace
