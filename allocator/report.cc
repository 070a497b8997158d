// The exit report (RDMALLOC_STATS=1|json): built on the stack and written
// with write(2), because at exit the heap may already be half torn down by
// other destructors and stdio may be gone.
#include <fcntl.h>
#include <unistd.h>

#include <cstdarg>
#include <cstdio>
#include <cstring>

#include "allocator/heap.h"
#include "allocator/init.h"

namespace rdmalloc {
namespace {

// Appends to a fixed buffer; silently stops at its end.
class Out {
 public:
  void Add(const char* format, ...) __attribute__((format(printf, 2, 3))) {
    if (len_ >= sizeof buf_ - 1) return;
    va_list ap;
    va_start(ap, format);
    int n = vsnprintf(buf_ + len_, sizeof buf_ - len_, format, ap);
    va_end(ap);
    if (n > 0) len_ += static_cast<size_t>(n) < sizeof buf_ - len_ ? n : sizeof buf_ - 1 - len_;
  }
  const char* data() const { return buf_; }
  size_t size() const { return len_; }

 private:
  char buf_[4096];
  size_t len_ = 0;
};

double Mib(uint64_t bytes) { return static_cast<double>(bytes) / (1 << 20); }
double AvgUs(uint64_t ns, uint64_t calls) { return calls ? ns / 1000.0 / calls : 0.0; }
unsigned long long U(uint64_t v) { return static_cast<unsigned long long>(v); }

void Json(Out& o, const struct rdmalloc_stats& s, const Config& c, const char* backend, const char* device) {
  o.Add("{\"rdmalloc\":1,\"pid\":%d,\"backend\":\"%s\",\"device\":\"%s\",\"register\":\"%s\",", getpid(),
        backend, device, c.register_mode == RegisterMode::kEager ? "eager" : "lazy");
  o.Add("\"regions_live\":%llu,\"regions_created\":%llu,\"regions_released\":%llu,",
        U(s.regions_live), U(s.regions_created), U(s.regions_released));
  o.Add("\"bytes_mapped\":%llu,\"bytes_in_use\":%llu,\"bytes_registered\":%llu,\"bytes_pinned\":%llu,",
        U(s.bytes_mapped), U(s.bytes_in_use), U(s.bytes_registered), U(s.bytes_pinned));
  o.Add("\"reg_calls\":%llu,\"reg_ns\":%llu,\"dereg_calls\":%llu,\"dereg_ns\":%llu,", U(s.reg_calls),
        U(s.reg_ns), U(s.dereg_calls), U(s.dereg_ns));
  o.Add("\"reg_failures\":%llu,\"cap_hits\":%llu,\"max_pinned\":%llu,", U(s.reg_failures),
        U(s.cap_hits), U(s.max_pinned));
  o.Add("\"lookups\":%llu,\"lookup_slow\":%llu,\"lookup_not_ours\":%llu,\"lookup_cross\":%llu,",
        U(s.lookups), U(s.lookup_slow), U(s.lookup_not_ours), U(s.lookup_cross));
  o.Add("\"lookup_reg_failed\":%llu,\"lookup_einval\":%llu,\"foreign_extents\":%llu,",
        U(s.lookup_reg_failed), U(s.lookup_einval), U(s.foreign_extents));
  char access[128];
  FormatAccess(c.access, access, sizeof access);
  o.Add("\"plain_access\":\"%s\",\"plain_heap_remote\":%s,", access,
        (c.access & kRemoteAccess) != 0 ? "true" : "false");
  o.Add("\"observers\":%llu,\"releases_notified\":%llu,", U(s.observers),
        U(s.releases_notified));
  o.Add("\"mrs_served\":%llu,\"mrs_forwarded\":%llu,\"mrs_live\":%llu,"
        "\"mrs_forwarded_on_heap\":%llu,\"releases_held_by_mrs\":%llu,",
        U(s.mrs_served), U(s.mrs_forwarded), U(s.mrs_live), U(s.mrs_forwarded_on_heap),
        U(s.releases_held_by_mrs));
  o.Add("\"releases_deferred\":%llu,\"domains\":[", U(s.releases_deferred));
  bool first = true;
  for (int d = 0; d < RDMALLOC_MAX_DOMAINS; d++) {
    const rdmalloc_domain_stats& ds = s.domain[d];
    if (!ds.open && ds.reg_calls == 0) continue;
    o.Add("%s{\"index\":%d,\"pd\":\"%p\",\"open\":%s,\"bytes_registered\":%llu,\"reg_calls\":%llu,"
          "\"dereg_calls\":%llu,\"reg_failures\":%llu}",
          first ? "" : ",", d, static_cast<void*>(ds.pd), ds.open ? "true" : "false",
          U(ds.bytes_registered), U(ds.reg_calls), U(ds.dereg_calls), U(ds.reg_failures));
    first = false;
  }
  o.Add("]}\n");
}

void Text(Out& o, const struct rdmalloc_stats& s, const Config& c, const char* backend, const char* device) {
  o.Add("rdmalloc report (pid %d)\n", getpid());
  o.Add("  backend      %s (%s), %s registration, %llu domain(s)\n", backend, device,
        c.register_mode == RegisterMode::kEager ? "eager" : "lazy", U(s.domains));
  char access[128];
  FormatAccess(c.access, access, sizeof access);
  if ((c.access & kRemoteAccess) != 0)
    o.Add("  access       plain heap %s -- WARNING: RDMALLOC_ACCESS widened it: a peer holding any "
          "of its rkeys can reach unrelated heap data; use rdmalloc_alloc for remote buffers\n",
          access);
  else
    o.Add("  access       plain heap %s (local only; remote access through rdmalloc_alloc)\n",
          access);
  o.Add("  regions      %llu live, %llu created, %llu released\n", U(s.regions_live),
        U(s.regions_created), U(s.regions_released));
  o.Add("  memory       %.1f MiB mapped, %.1f MiB in use by jemalloc, %.1f MiB registered "
        "(%.1f MiB distinct)",
        Mib(s.bytes_mapped), Mib(s.bytes_in_use), Mib(s.bytes_registered), Mib(s.bytes_pinned));
  if (s.max_pinned != ~uint64_t{0}) o.Add(" (cap %.1f MiB, hit %llu times)", Mib(s.max_pinned), U(s.cap_hits));
  o.Add("\n  registration %llu reg (avg %.1f us), %llu dereg (avg %.1f us), %llu failed\n",
        U(s.reg_calls), AvgUs(s.reg_ns, s.reg_calls), U(s.dereg_calls),
        AvgUs(s.dereg_ns, s.dereg_calls), U(s.reg_failures));
  for (int d = 0; d < RDMALLOC_MAX_DOMAINS && s.domains > 1; d++) {
    const rdmalloc_domain_stats& ds = s.domain[d];
    if (!ds.open) continue;
    o.Add("    domain %d   pd %p: %.1f MiB registered, %llu reg, %llu dereg, %llu failed\n", d,
          static_cast<void*>(ds.pd), Mib(ds.bytes_registered), U(ds.reg_calls), U(ds.dereg_calls),
          U(ds.reg_failures));
  }
  o.Add("  lookups      %llu (%llu registered first; misses: %llu not ours, %llu crossing, "
        "%llu reg failed, %llu bad args)\n",
        U(s.lookups), U(s.lookup_slow), U(s.lookup_not_ours), U(s.lookup_cross),
        U(s.lookup_reg_failed), U(s.lookup_einval));
  if (s.mrs_served != 0 || s.mrs_forwarded != 0)
    o.Add("  ibv_reg_mr   %llu served from the heap's registrations, %llu forwarded to libibverbs "
          "(%llu served live, %llu forwarded live on heap pages; %llu releases held back by MRs)\n",
          U(s.mrs_served), U(s.mrs_forwarded), U(s.mrs_live), U(s.mrs_forwarded_on_heap),
          U(s.releases_held_by_mrs));
  if (s.observers != 0 || s.releases_notified != 0)
    o.Add("  observers    %llu, %llu release notifications\n", U(s.observers),
          U(s.releases_notified));
}

__attribute__((destructor)) void ExitReport() {
  if (g_init_state.load() != kReady) return;
  Heap& heap = TheHeap();
  const Config& c = heap.config();
  if (c.stats == StatsMode::kOff) return;
  struct rdmalloc_stats s;
  heap.Stats(&s, sizeof s);
  Out o;
  if (c.stats == StatsMode::kJson) Json(o, s, c, heap.BackendName(), heap.DeviceDescription());
  else Text(o, s, c, heap.BackendName(), heap.DeviceDescription());
  int fd = STDERR_FILENO;
  if (c.stats_file[0] != '\0') fd = open(c.stats_file, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) return;
  ssize_t ignored = write(fd, o.data(), o.size());
  (void)ignored;
  if (fd != STDERR_FILENO) close(fd);
}

}  // namespace
}  // namespace rdmalloc
