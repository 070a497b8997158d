// glibc's own malloc entry points, answered for rdmalloc's heap: malloc_trim,
// mallinfo2, mallinfo, mallopt, malloc_info and malloc_stats. Without them a
// program reaches glibc's, which trim and describe glibc's heap: empty under
// rdmalloc. Built on rdmalloc_stats, the heap's region visitor and
// jemalloc's mallctl. docs/TUNING.md ("glibc's malloc extras") documents
// every number and answer.
#include <fcntl.h>
#include <jemalloc/jemalloc.h>
#include <malloc.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "allocator/heap.h"
#include "allocator/init.h"
#include "allocator/jemalloc_api.h"
#include "allocator/rdmalloc.h"

#define RDMALLOC_EXPORT extern "C" __attribute__((visibility("default")))

namespace rdmalloc {
namespace {

#define RDMALLOC_STR2(x) #x
#define RDMALLOC_STR(x) RDMALLOC_STR2(x)
#define ALL_ARENAS RDMALLOC_STR(MALLCTL_ARENAS_ALL)

size_t JemallocSize(const char* name) {
  size_t v = 0, len = sizeof v;
  return rdmj_mallctl(name, &v, &len, nullptr, 0) == 0 ? v : 0;
}

// Everything the glibc calls report, read once per call.
struct HeapNumbers {
  // jemalloc's totals over all arenas, bytes.
  size_t allocated, active, metadata, resident, mapped, retained, tcache, dirty, muzzy, page;
  unsigned narenas;
  const char* version;
  struct rdmalloc_stats rd;
  struct mallinfo2 info;
};

HeapNumbers ReadHeap() {
  HeapNumbers h;
  memset(&h, 0, sizeof h);
  uint64_t epoch = 1;
  size_t len = sizeof epoch;
  rdmj_mallctl("epoch", &epoch, &len, &epoch, sizeof epoch);  // refresh jemalloc's stats
  h.allocated = JemallocSize("stats.allocated");
  h.active = JemallocSize("stats.active");
  h.metadata = JemallocSize("stats.metadata");
  h.resident = JemallocSize("stats.resident");
  h.mapped = JemallocSize("stats.mapped");
  h.retained = JemallocSize("stats.retained");
  h.tcache = JemallocSize("stats.arenas." ALL_ARENAS ".tcache_bytes");
  h.page = JemallocSize("arenas.page");
  h.dirty = JemallocSize("stats.arenas." ALL_ARENAS ".pdirty") * h.page;
  h.muzzy = JemallocSize("stats.arenas." ALL_ARENAS ".pmuzzy") * h.page;
  len = sizeof h.narenas;
  rdmj_mallctl("arenas.narenas", &h.narenas, &len, nullptr, 0);
  len = sizeof h.version;
  if (rdmj_mallctl("version", &h.version, &len, nullptr, 0) != 0) h.version = "?";
  rdmalloc_stats(&h.rd, sizeof h.rd);

  // The mapping documented in docs/TUNING.md.
  struct mallinfo2& m = h.info;
  // What jemalloc mapped outside rdmalloc's regions: arena 0's metadata and
  // any extent made before the hooks (jemalloc's mapped minus what it holds
  // of rdmalloc's regions).
  size_t outside = h.mapped > h.rd.bytes_in_use ? h.mapped - h.rd.bytes_in_use : 0;
  m.arena = h.rd.bytes_mapped + outside;
  // jemalloc counts blocks in thread caches as allocated; the program does not hold them.
  m.uordblks = h.allocated > h.tcache ? h.allocated - h.tcache : 0;
  m.fordblks = m.arena > m.uordblks ? m.arena - m.uordblks : 0;
  m.fsmblks = h.tcache;
  m.keepcost = h.dirty + h.muzzy;
  return h;
}

// struct mallinfo2's fields, in glibc's order (struct mallinfo has the same as int).
#define RDMALLOC_MALLINFO_FIELDS(X) \
  X(arena) X(ordblks) X(smblks) X(hblks) X(hblkhd) X(usmblks) X(fsmblks) X(uordblks) X(fordblks) X(keepcost)
// HeapNumbers' jemalloc fields that malloc_info lists.
#define RDMALLOC_JEMALLOC_FIELDS(X) \
  X(narenas) X(page) X(allocated) X(active) X(metadata) X(resident) X(mapped) X(retained) X(tcache) X(dirty) X(muzzy)
// The fields of struct rdmalloc_domain_stats and rdmalloc_stats that malloc_info lists.
#define RDMALLOC_DOMAIN_FIELDS(X) X(open) X(bytes_registered) X(reg_calls) X(dereg_calls) X(reg_failures)
#define RDMALLOC_STATS_FIELDS(X)                                                                 \
  X(regions_live) X(regions_created) X(regions_released) X(bytes_mapped) X(bytes_in_use)         \
  X(bytes_registered) X(bytes_pinned) X(max_pinned) X(reg_calls) X(dereg_calls) X(reg_failures) \
  X(cap_hits) X(lookups) X(foreign_extents) X(releases_deferred) X(releases_notified) X(observers)

int Saturated(size_t v) { return v > static_cast<size_t>(INT_MAX) ? INT_MAX : static_cast<int>(v); }

// Virtual size and resident set of this process, in pages; -1 if unknown.
// Read with plain system calls: nothing here allocates.
struct Footprint {
  long size = -1, resident = -1;
};

Footprint ReadFootprint() {
  Footprint f;
  int fd = open("/proc/self/statm", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return f;
  char buf[128];
  ssize_t n = read(fd, buf, sizeof buf - 1);
  close(fd);
  if (n <= 0) return f;
  buf[n] = 0;
  char* end;
  long size = strtol(buf, &end, 10);
  if (end == buf) return f;
  char* end2;
  long resident = strtol(end, &end2, 10);
  if (end2 == end) return f;
  f.size = size;
  f.resident = resident;
  return f;
}

// --- malloc_info's XML.

// Writes s as the content of an attribute value.
void PutEscaped(FILE* fp, const char* s) {
  for (; *s != 0; s++) {
    switch (*s) {
      case '<': fputs("&lt;", fp); break;
      case '>': fputs("&gt;", fp); break;
      case '&': fputs("&amp;", fp); break;
      case '"': fputs("&quot;", fp); break;
      default:
        if (static_cast<unsigned char>(*s) < 0x20) fputc(' ', fp);  // not allowed raw in XML 1.0
        else fputc(*s, fp);
    }
  }
}

void PutNumber(FILE* fp, const char* name, unsigned long long v) { fprintf(fp, " %s=\"%llu\"", name, v); }

// One <region> per live region, with one <registration> per domain.
void PutRegion(const RegionInfo& r, void* ctx) {
  FILE* fp = static_cast<FILE*>(ctx);
  const char* kind = r.access_class != 0 ? "class" : r.dedicated ? "dedicated" : "plain";
  fprintf(fp, "<region begin=\"0x%lx\" end=\"0x%lx\"", static_cast<unsigned long>(r.base),
          static_cast<unsigned long>(r.base + r.size));
  PutNumber(fp, "size", r.size);
  fprintf(fp, " used_percent=\"%.1f\" kind=\"%s\"",
          r.pages != 0 ? 100.0 * r.pages_in_use / r.pages : 0.0, kind);
  if (r.access_class != 0)
    fprintf(fp, " remote=\"%s\"", ClassRightsName(r.access_class));
  fputs(">\n", fp);
  for (int d = 0; d < kMaxDomains; d++) {
    if (r.reg[d].state == RegSlot::kRegistered)
      fprintf(fp, "<registration domain=\"%d\" lkey=\"%u\" rkey=\"%u\"/>\n", d, r.reg[d].lkey,
              r.reg[d].rkey);
    else if (r.reg[d].state == RegSlot::kFailed)
      fprintf(fp, "<registration domain=\"%d\" failed=\"1\"/>\n", d);
  }
  fputs("</region>\n", fp);
}

}  // namespace
}  // namespace rdmalloc

using rdmalloc::EnsureInitialised;

// Flushes this thread's cache and makes every arena give back what it keeps
// for reuse (its decay, all at once) through rdmalloc's hooks; then rdmalloc
// gives back what it keeps (RDMALLOC_RETAIN): it releases empty regions and
// purges free pages of unregistered regions; pages under a registration are
// never purged. `pad`
// has no meaning here (there is no heap top to leave room at). Returns 1 if
// the process's mapped size or resident set fell meanwhile (/proc/self/statm),
// or if regions were handed to rdmalloc's release thread (with observers or
// the verbs backend: they leave a moment later; this does not wait), else 0.
RDMALLOC_EXPORT int malloc_trim(size_t pad) noexcept {
  (void)pad;
  EnsureInitialised();
  rdmalloc::Footprint before = rdmalloc::ReadFootprint();
  struct rdmalloc_stats queued_before, queued_after;
  rdmalloc_stats(&queued_before, sizeof queued_before);
  rdmj_mallctl("thread.tcache.flush", nullptr, nullptr, nullptr, 0);
  rdmj_mallctl("arena." ALL_ARENAS ".purge", nullptr, nullptr, nullptr, 0);
  rdmalloc::TheHeap().GiveBackRetained();  // what RDMALLOC_RETAIN keeps for reuse
  rdmalloc_stats(&queued_after, sizeof queued_after);
  rdmalloc::Footprint after = rdmalloc::ReadFootprint();
  if (queued_after.releases_deferred > queued_before.releases_deferred) return 1;
  if (before.size < 0 || after.size < 0) return 0;
  return after.size < before.size || after.resident < before.resident ? 1 : 0;
}

RDMALLOC_EXPORT struct mallinfo2 mallinfo2() noexcept {
  EnsureInitialised();
  return rdmalloc::ReadHeap().info;
}

// glibc's int fields wrap past 2 GiB; these stop at INT_MAX.
RDMALLOC_EXPORT struct mallinfo mallinfo() noexcept {
  EnsureInitialised();
  struct mallinfo2 m2 = rdmalloc::ReadHeap().info;
  struct mallinfo m;
#define RDMALLOC_SATURATE(f) m.f = rdmalloc::Saturated(m2.f);
  RDMALLOC_MALLINFO_FIELDS(RDMALLOC_SATURATE)
#undef RDMALLOC_SATURATE
  return m;
}

// None of glibc's parameters has an effect on rdmalloc (its equivalents are
// MALLOC_CONF and RDMALLOC_*, read at start): 0, glibc's "not done", for all.
RDMALLOC_EXPORT int mallopt(int param, int value) noexcept {
  (void)param;
  (void)value;
  return 0;
}

// glibc's element names where they mean the same (system, aspace, total
// mmap), then jemalloc's and rdmalloc's numbers and one element per region.
RDMALLOC_EXPORT int malloc_info(int options, FILE* fp) noexcept {
  if (options != 0 || fp == nullptr) return EINVAL;
  EnsureInitialised();
  rdmalloc::HeapNumbers h = rdmalloc::ReadHeap();
  const struct mallinfo2& m = h.info;
  const struct rdmalloc_stats& s = h.rd;
  using rdmalloc::PutNumber;
  // One attribute per field: name="value".
#define RDMALLOC_PUT_M(f) PutNumber(fp, #f, m.f);
#define RDMALLOC_PUT_H(f) PutNumber(fp, #f, h.f);
#define RDMALLOC_PUT_S(f) PutNumber(fp, #f, s.f);
#define RDMALLOC_PUT_DS(f) PutNumber(fp, #f, ds.f);
  fputs("<malloc version=\"1\" allocator=\"rdmalloc\">\n<mallinfo2", fp);
  RDMALLOC_MALLINFO_FIELDS(RDMALLOC_PUT_M)
  fputs("/>\n<total type=\"mmap\" count=\"0\" size=\"0\"/>\n", fp);
  fprintf(fp, "<system type=\"current\" size=\"%zu\"/>\n", m.arena);
  fprintf(fp, "<aspace type=\"total\" size=\"%zu\"/>\n", m.arena);
  fputs("<jemalloc version=\"", fp);
  rdmalloc::PutEscaped(fp, h.version);
  fputs("\"", fp);
  RDMALLOC_JEMALLOC_FIELDS(RDMALLOC_PUT_H)
  fputs("/>\n<rdmalloc backend=\"", fp);
  rdmalloc::PutEscaped(fp, rdmalloc_backend());
  fputs("\"", fp);
  RDMALLOC_STATS_FIELDS(RDMALLOC_PUT_S)
  fputs(">\n", fp);
  for (int d = 0; d < RDMALLOC_MAX_DOMAINS; d++) {
    const rdmalloc_domain_stats& ds = s.domain[d];
    if (!ds.open && ds.reg_calls == 0) continue;
    fprintf(fp, "<domain index=\"%d\" pd=\"%p\"", d, static_cast<void*>(ds.pd));
    RDMALLOC_DOMAIN_FIELDS(RDMALLOC_PUT_DS)
    fputs("/>\n", fp);
  }
#undef RDMALLOC_PUT_M
#undef RDMALLOC_PUT_H
#undef RDMALLOC_PUT_S
#undef RDMALLOC_PUT_DS
  rdmalloc::TheHeap().VisitRegions(rdmalloc::PutRegion, fp);
  fputs("</rdmalloc>\n</malloc>\n", fp);
  return 0;
}

// glibc's layout (a block for the heap, then the totals) on stderr, then
// rdmalloc's own line.
RDMALLOC_EXPORT void malloc_stats() noexcept {
  EnsureInitialised();
  rdmalloc::HeapNumbers h = rdmalloc::ReadHeap();
  const struct mallinfo2& m = h.info;
  fprintf(stderr,
          "rdmalloc heap:\n"
          "system bytes     = %10zu\n"
          "in use bytes     = %10zu\n"
          "Total (incl. mmap):\n"
          "system bytes     = %10zu\n"
          "in use bytes     = %10zu\n"
          "max mmap regions = %10d\n"
          "max mmap bytes   = %10d\n",
          m.arena, m.uordblks, m.arena, m.uordblks, 0, 0);
  fprintf(stderr, "rdmalloc: %s backend, %llu regions, %llu bytes mapped, %llu registered, %llu pinned\n",
          rdmalloc_backend(), static_cast<unsigned long long>(h.rd.regions_live),
          static_cast<unsigned long long>(h.rd.bytes_mapped),
          static_cast<unsigned long long>(h.rd.bytes_registered),
          static_cast<unsigned long long>(h.rd.bytes_pinned));
}
