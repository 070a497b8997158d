// glibc compatibility of the malloc family beyond malloc/free, one test per
// function: memalign, aligned_alloc, posix_memalign, valloc/pvalloc,
// malloc_trim, mallinfo2, mallinfo, mallopt, malloc_info, malloc_stats.
//
// glibc 2.36 is the contract where programs rely on it: test/glibc_probes.h's
// probes run in this process (linked with rdmalloc), in //test:glibc_probe
// without rdmalloc (glibc's own malloc) and in glibc_probe with
// librdmalloc.so preloaded (which also proves the .so exports each name); the
// three must state the same outcomes. The rest checks that the numbers and
// the XML describe rdmalloc's heap, not glibc's empty one.
#include <expat.h>
#include <gtest/gtest.h>
#include <limits.h>
#include <malloc.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "test/glibc_probes.h"
#include "test/test_util.h"

namespace rdmalloc_test {
namespace {

constexpr size_t kMiB = size_t{1} << 20;
using ProbeMap = std::map<std::string, std::string>;

ProbeMap ToMap(const std::vector<glibc_probes::Probe>& probes) {
  ProbeMap m;
  for (const auto& p : probes) m[p.first] = p.second;
  return m;
}

// Runs //test:glibc_probe (with `preload` in LD_PRELOAD, or none).
ProbeMap RunProbeBinary(const std::string& preload, std::string* error) {
  const char* probe = getenv("GLIBC_PROBE");
  if (probe == nullptr) {
    *error = "GLIBC_PROBE is not set (run through bazel test)";
    return {};
  }
  std::string cmd = preload.empty() ? "env -u LD_PRELOAD '" + std::string(probe) + "'"
                                    : "env LD_PRELOAD='" + preload + "' '" + probe + "'";
  FILE* f = popen(cmd.c_str(), "r");
  if (f == nullptr) {
    *error = "cannot run " + cmd;
    return {};
  }
  ProbeMap m;
  char line[512];
  while (fgets(line, sizeof line, f) != nullptr) {
    line[strcspn(line, "\n")] = 0;
    char* tab = strchr(line, '\t');
    if (tab == nullptr) continue;
    *tab = 0;
    m[line] = tab + 1;
  }
  int status = pclose(f);
  if (status != 0) *error = cmd + " exited with status " + std::to_string(status);
  return m;
}

struct ProbeRuns {
  ProbeMap glibc, preloaded, linked;
  std::string error;
};

const ProbeRuns& Runs() {
  static const ProbeRuns runs = [] {
    ProbeRuns r;
    r.glibc = RunProbeBinary("", &r.error);
    const char* so = getenv("LIBRDMALLOC_SO");
    char abs[PATH_MAX];
    if (so == nullptr || realpath(so, abs) == nullptr) {
      r.error += " LIBRDMALLOC_SO is not set or missing";
    } else {
      r.preloaded = RunProbeBinary(abs, &r.error);
    }
    r.linked = ToMap(glibc_probes::AllProbes());
    return r;
  }();
  return runs;
}

std::string Outcome(const ProbeMap& m, const std::string& name) {
  auto it = m.find(name);
  return it == m.end() ? "(not run)" : it->second;
}

// Every probe whose name starts with `prefix` has glibc's outcome under
// rdmalloc, linked and preloaded.
void ExpectSameAsGlibc(const std::string& prefix) {
  const ProbeRuns& r = Runs();
  ASSERT_TRUE(r.error.empty()) << r.error;
  int compared = 0;
  for (const auto& [name, want] : r.glibc) {
    if (name.compare(0, prefix.size(), prefix) != 0) continue;
    compared++;
    EXPECT_EQ(Outcome(r.linked, name), want) << name << ": rdmalloc (linked) vs glibc";
    EXPECT_EQ(Outcome(r.preloaded, name), want) << name << ": librdmalloc.so (preloaded) vs glibc";
  }
  EXPECT_GT(compared, 0) << "no probe named " << prefix << "...";
}

// A size the compiler cannot see (it warns about the deliberately huge ones).
size_t Opaque(size_t v) {
  volatile size_t hidden = v;
  return hidden;
}

bool IsAligned(const void* p, size_t alignment) {
  return reinterpret_cast<uintptr_t>(p) % alignment == 0;
}

TEST(GlibcCompat, MemalignRoundsAlignmentUpLikeGlibc) {
  // jemalloc's own memalign ignores the alignment for size 0 (and then
  // hands out consecutive 8-byte blocks: keep four).
  void* zero[4];
  for (void*& z : zero) {
    z = memalign(4096, 0);
    EXPECT_TRUE(z != nullptr && IsAligned(z, 4096)) << z;
  }
  for (void* z : zero) free(z);
  // The cases of issue 13: stock jemalloc returns NULL, glibc memory.
  void* p = memalign(24, 100);
  ASSERT_NE(p, nullptr);
  EXPECT_TRUE(IsAligned(p, 32));  // the next power of two
  EXPECT_GE(malloc_usable_size(p), 100u);
  free(p);
  p = memalign(0, 16);  // no alignment asked
  ASSERT_NE(p, nullptr);
  free(p);
  p = memalign(4097, 10);
  ASSERT_NE(p, nullptr);
  EXPECT_TRUE(IsAligned(p, 8192));
  free(p);
  // No power of two to round to: EINVAL. Too big: ENOMEM, never a wrap.
  errno = 0;
  EXPECT_EQ(memalign(SIZE_MAX / 2 + 2, 1), nullptr);
  EXPECT_EQ(errno, EINVAL);
  errno = 0;
  EXPECT_EQ(memalign(SIZE_MAX / 2, 1), nullptr);  // rounds to 2^63
  EXPECT_EQ(errno, ENOMEM);
  errno = 0;
  EXPECT_EQ(memalign(64, Opaque(SIZE_MAX - 10)), nullptr);
  EXPECT_EQ(errno, ENOMEM);
  ExpectSameAsGlibc("memalign(");
}

TEST(GlibcCompat, AlignedAllocRoundsAlignmentUpLikeGlibc) {
  void* p = aligned_alloc(0, 16);
  ASSERT_NE(p, nullptr);
  free(p);
  p = aligned_alloc(24, 48);
  ASSERT_NE(p, nullptr);
  EXPECT_TRUE(IsAligned(p, 32));
  EXPECT_GE(malloc_usable_size(p), 48u);
  free(p);
  p = aligned_alloc(64, 100);  // size not a multiple of the alignment: fine in glibc
  ASSERT_NE(p, nullptr);
  EXPECT_TRUE(IsAligned(p, 64));
  free(p);
  errno = 0;
  EXPECT_EQ(aligned_alloc(SIZE_MAX, 16), nullptr);
  EXPECT_EQ(errno, EINVAL);
  errno = 0;
  EXPECT_EQ(aligned_alloc(size_t{1} << 62, 1), nullptr);
  EXPECT_EQ(errno, ENOMEM);
  ExpectSameAsGlibc("aligned_alloc(");
}

TEST(GlibcCompat, PosixMemalignRefusesBadAlignmentsWithEinval) {
  for (size_t a : {size_t{0}, size_t{1}, size_t{4}, size_t{24}, size_t{100}, SIZE_MAX}) {
    void* p = reinterpret_cast<void*>(0x1234);
    errno = 0;
    EXPECT_EQ(posix_memalign(&p, a, 64), EINVAL) << "alignment " << a;
    EXPECT_EQ(p, reinterpret_cast<void*>(0x1234)) << "alignment " << a;
    EXPECT_EQ(errno, 0) << "alignment " << a;  // the result says it; errno is left alone
  }
  void* p = nullptr;
  EXPECT_EQ(posix_memalign(&p, SIZE_MAX / 2 + 1, 1), ENOMEM);
  EXPECT_EQ(posix_memalign(&p, 8, SIZE_MAX), ENOMEM);
  ASSERT_EQ(posix_memalign(&p, 64, 100), 0);
  EXPECT_TRUE(IsAligned(p, 64));
  free(p);
  ExpectSameAsGlibc("posix_memalign(");
}

TEST(GlibcCompat, VallocAndPvallocFailWithEnomemLikeGlibc) {
  size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  errno = 0;
  EXPECT_EQ(valloc(Opaque(SIZE_MAX)), nullptr);
  EXPECT_EQ(errno, ENOMEM);
  errno = 0;
  EXPECT_EQ(pvalloc(SIZE_MAX - page + 2), nullptr);  // rounding up to a page overflows
  EXPECT_EQ(errno, ENOMEM);
  void* zero[4];  // as memalign, jemalloc's valloc ignores the alignment for size 0
  for (void*& z : zero) {
    z = valloc(0);
    EXPECT_TRUE(z != nullptr && IsAligned(z, page)) << z;
  }
  for (void* z : zero) free(z);
  void* p = pvalloc(1);
  ASSERT_NE(p, nullptr);
  EXPECT_TRUE(IsAligned(p, page));
  EXPECT_GE(malloc_usable_size(p), page);
  free(p);
  ExpectSameAsGlibc("valloc(");
  ExpectSameAsGlibc("pvalloc(");
}

// Pages of [p, p+n) resident, or -1 if any of it is not mapped any more.
long ResidentPages(const void* p, size_t n) {
  size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  std::vector<unsigned char> vec(n / page + 1);
  if (mincore(const_cast<void*>(p), n, vec.data()) != 0) return errno == ENOMEM ? -1 : -2;
  long resident = 0;
  for (size_t i = 0; i < n / page; i++) resident += vec[i] & 1;
  return resident;
}

TEST(GlibcCompat, MallocTrimGivesBackUnusedHeapButNeverRegisteredPages) {
  // The test runs with RDMALLOC_DECAY_MS=-1: jemalloc keeps what is freed
  // until malloc_trim makes it give it back.
  // 1. Freed memory of the plain heap leaves the process: regions released,
  //    free pages of the rest purged.
  std::vector<void*> blocks;
  for (int i = 0; i < 48; i++) {
    blocks.push_back(malloc(kMiB));
    memset(blocks.back(), i + 1, kMiB);
  }
  std::vector<long> resident(blocks.size());
  for (void* b : blocks) free(b);
  struct rdmalloc_stats s0 = Stats();
  long rss0 = StatusKb("VmRSS");
  int trimmed = malloc_trim(0);
  // Measured, not guessed: right after, nothing is left to give back.
  int again = malloc_trim(0);
  for (size_t i = 0; i < blocks.size(); i++) resident[i] = ResidentPages(blocks[i], kMiB);
  struct rdmalloc_stats s1 = Stats();
  long rss1 = StatusKb("VmRSS");
  printf("malloc_trim(0) = %d: mapped %llu -> %llu MiB, RSS %ld -> %ld MiB, %llu regions released\n",
         trimmed, (unsigned long long)(s0.bytes_mapped >> 20), (unsigned long long)(s1.bytes_mapped >> 20),
         rss0 >> 10, rss1 >> 10, (unsigned long long)(s1.regions_released - s0.regions_released));
  EXPECT_EQ(trimmed, 1);
  for (size_t i = 0; i < blocks.size(); i++) {
    EXPECT_LE(resident[i], 0) << "block " << i << ": " << resident[i] << " pages still resident";
  }
  uint64_t unmapped = s0.bytes_mapped > s1.bytes_mapped ? s0.bytes_mapped - s1.bytes_mapped : 0;
  uint64_t rss_fell = rss0 > rss1 ? static_cast<uint64_t>(rss0 - rss1) << 10 : 0;
  EXPECT_GE(unmapped > rss_fell ? unmapped : rss_fell, 40 * kMiB);
  EXPECT_EQ(again, 0);

  // 2. Pages of a registered region stay, also when freed: the NIC and the
  //    CPU still see the same bytes through keys taken before the free.
  //    (Memory peers may read: an access class, so rdmalloc_dma_read works.)
  void* live = rdmalloc_alloc(64 << 10, RDMALLOC_REMOTE_READ);
  void* freed = rdmalloc_alloc(kMiB, RDMALLOC_REMOTE_READ);
  ASSERT_NE(live, nullptr);
  ASSERT_NE(freed, nullptr);
  rdmalloc_keys live_keys, freed_keys;
  ASSERT_EQ(rdmalloc_lookup(live, 64 << 10, nullptr, &live_keys), RDMALLOC_OK);
  ASSERT_EQ(rdmalloc_lookup(freed, kMiB, nullptr, &freed_keys), RDMALLOC_OK);
  ASSERT_EQ(live_keys.region_base, freed_keys.region_base) << "want both in one region";
  FillPattern(freed, kMiB, 13);
  std::vector<uint8_t> nic(kMiB);
  std::vector<uint8_t> cpu(kMiB);
  uint64_t registered = Stats().bytes_registered;
  free(freed);
  malloc_trim(0);
  memcpy(cpu.data(), freed, kMiB);  // freed but mapped: the region holds `live`
  ASSERT_EQ(rdmalloc_dma_read(&freed_keys, 0, nic.data(), kMiB), RDMALLOC_OK);
  EXPECT_TRUE(HasPattern(cpu.data(), kMiB, 13)) << "registered pages were purged";
  EXPECT_EQ(memcmp(cpu.data(), nic.data(), kMiB), 0) << "NIC and CPU see different pages";
  EXPECT_EQ(Stats().bytes_registered, registered);
  free(live);
}

// A release observer that holds the release thread until told to go on, and
// notes the first ranges it hears of.
struct SlowObserver {
  std::atomic<bool> go{false};
  std::atomic<bool> goodbye{false};  // the last call, fn(NULL, 0, arg), came
  std::atomic<int> calls{0};
  std::atomic<uintptr_t> begin[16], end[16];
  static void Callback(void* addr, size_t len, void* arg) {
    auto* self = static_cast<SlowObserver*>(arg);
    if (addr == nullptr) {
      self->goodbye = true;
      return;
    }
    double deadline = NowSeconds() + 5;
    while (!self->go.load() && NowSeconds() < deadline) usleep(1000);
    int i = self->calls.load();
    if (i < 16) {
      self->begin[i] = reinterpret_cast<uintptr_t>(addr);
      self->end[i] = reinterpret_cast<uintptr_t>(addr) + len;
    }
    self->calls = i + 1;
  }
  bool Heard(const void* p) const {
    uintptr_t a = reinterpret_cast<uintptr_t>(p);
    for (int i = 0; i < calls.load() && i < 16; i++) {
      if (begin[i] <= a && a < end[i]) return true;
    }
    return false;
  }
};

TEST(GlibcCompat, MallocTrimDoesNotWaitForReleaseCallbacks) {
  // With an observer, a region emptied by malloc_trim is released by the
  // release thread, after the callback: malloc_trim must not wait for it.
  SlowObserver observer;
  ASSERT_EQ(rdmalloc_on_release(SlowObserver::Callback, &observer), RDMALLOC_OK);
  void* big = malloc(72 * kMiB);  // above RDMALLOC_REGION_SIZE: a region of its own
  ASSERT_NE(big, nullptr);
  free(big);  // kept by jemalloc (RDMALLOC_DECAY_MS=-1)
  double t0 = NowSeconds();
  malloc_trim(0);
  double took = NowSeconds() - t0;
  observer.go = true;
  for (double deadline = NowSeconds() + 10; !observer.Heard(big) && NowSeconds() < deadline;) usleep(1000);
  EXPECT_LT(took, 2.0) << "malloc_trim waited for the release callback";
  EXPECT_TRUE(observer.Heard(big)) << "the region was not released; " << observer.calls << " releases heard";
  ASSERT_EQ(rdmalloc_on_release_remove(SlowObserver::Callback, &observer), RDMALLOC_OK);
  // observer lives on this stack frame: rdmalloc's last call to it, on the
  // release thread after removal returns, must come before the frame goes
  // (it used to write into whatever lived there next: a crash at exit now
  // and then, in jemalloc's thread-cache flush).
  for (double deadline = NowSeconds() + 10; !observer.goodbye.load() && NowSeconds() < deadline;)
    usleep(1000);
  ASSERT_TRUE(observer.goodbye.load()) << "no last call after rdmalloc_on_release_remove";
}

TEST(GlibcCompat, Mallinfo2ReportsRdmallocsHeap) {
  struct mallinfo2 m0 = mallinfo2();
  std::vector<void*> blocks;
  blocks.reserve(10 + 4096);
  for (int i = 0; i < 10; i++) blocks.push_back(malloc(kMiB));
  for (int i = 0; i < 4096; i++) blocks.push_back(malloc(256));
  struct mallinfo2 m1 = mallinfo2();
  struct rdmalloc_stats s1 = Stats();
  printf("mallinfo2 with 11 MiB allocated: arena %zu uordblks %zu fordblks %zu keepcost %zu fsmblks %zu\n",
         m1.arena, m1.uordblks, m1.fordblks, m1.keepcost, m1.fsmblks);
  EXPECT_GE(m1.uordblks - m0.uordblks, 11 * kMiB);
  EXPECT_LT(m1.uordblks - m0.uordblks, 12 * kMiB);
  EXPECT_GE(m1.arena, s1.bytes_mapped);  // rdmalloc's regions and more
  EXPECT_EQ(m1.uordblks + m1.fordblks, m1.arena);
  EXPECT_EQ(m1.hblks, 0u);  // no separately mapped chunks: all of it is in arena
  EXPECT_EQ(m1.hblkhd, 0u);
  EXPECT_EQ(m1.usmblks, 0u);  // always 0, as in glibc
  for (void* b : blocks) free(b);
  struct mallinfo2 m2 = mallinfo2();
  EXPECT_LT(m2.uordblks, m0.uordblks + kMiB);
  // Freed and kept by jemalloc (RDMALLOC_DECAY_MS=-1) until malloc_trim.
  EXPECT_GE(m2.keepcost, 10 * kMiB);
  EXPECT_LE(m2.keepcost, m2.fordblks);
  malloc_trim(0);
  struct mallinfo2 m3 = mallinfo2();
  EXPECT_LT(m3.keepcost, kMiB);
  EXPECT_LT(m3.arena, m2.arena);
  ExpectSameAsGlibc("mallinfo2 ");
}

TEST(GlibcCompat, MallinfoSaturatesInsteadOfWrapping) {
  // 3 GiB, never touched: a region of its own, mapped but not resident.
  void* big = malloc(size_t{3} << 30);
  ASSERT_NE(big, nullptr);
  struct mallinfo2 m2 = mallinfo2();
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
  struct mallinfo m = mallinfo();
#pragma GCC diagnostic pop
  EXPECT_GE(m2.uordblks, size_t{3} << 30);
  EXPECT_EQ(m.arena, INT_MAX);
  EXPECT_EQ(m.uordblks, INT_MAX);
  EXPECT_EQ(static_cast<size_t>(m.fordblks), m2.fordblks < INT_MAX ? m2.fordblks : size_t{INT_MAX});
  free(big);
  malloc_trim(0);
  m2 = mallinfo2();
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
  m = mallinfo();
#pragma GCC diagnostic pop
  ASSERT_LT(m2.arena, size_t{INT_MAX});
  EXPECT_GT(m.arena, 0);
  EXPECT_LE(static_cast<size_t>(m.uordblks), m2.arena);
}

TEST(GlibcCompat, MalloptHonoursNoGlibcParameter) {
  // rdmalloc has none of glibc's knobs; saying 1 would pretend they worked.
  // (glibc answers 1 to all of these, and to unknown parameters too.)
  const int params[] = {M_MXFAST,       M_TRIM_THRESHOLD, M_TOP_PAD, M_MMAP_THRESHOLD, M_MMAP_MAX,
                        M_CHECK_ACTION, M_PERTURB,        M_ARENA_TEST, M_ARENA_MAX, 12345};
  for (int param : params) EXPECT_EQ(mallopt(param, 1), 0) << "param " << param;
  // And nothing changed: freshly allocated memory is not perturbed.
  void* p = malloc(64);
  EXPECT_NE(p, nullptr);
  free(p);
}

struct Element {
  std::string name;
  std::map<std::string, std::string> attrs;
  int depth;
};

struct XmlDoc {
  std::vector<Element> elements;
  std::string error;
  int depth = 0;
};

void XMLCALL StartElement(void* data, const XML_Char* name, const XML_Char** attrs) {
  auto* doc = static_cast<XmlDoc*>(data);
  Element e{name, {}, doc->depth++};
  for (int i = 0; attrs[i] != nullptr; i += 2) e.attrs[attrs[i]] = attrs[i + 1];
  doc->elements.push_back(e);
}

void XMLCALL EndElement(void* data, const XML_Char*) { static_cast<XmlDoc*>(data)->depth--; }

XmlDoc ParseXml(const std::string& text) {
  XmlDoc doc;
  XML_Parser parser = XML_ParserCreate(nullptr);
  XML_SetUserData(parser, &doc);
  XML_SetElementHandler(parser, StartElement, EndElement);
  if (XML_Parse(parser, text.data(), static_cast<int>(text.size()), 1) == XML_STATUS_ERROR) {
    doc.error = std::string(XML_ErrorString(XML_GetErrorCode(parser))) + " at line " +
                std::to_string(XML_GetCurrentLineNumber(parser));
  }
  XML_ParserFree(parser);
  return doc;
}

std::string Attr(const Element& e, const char* attr) {
  auto it = e.attrs.find(attr);
  return it == e.attrs.end() ? "(none)" : it->second;
}

uint64_t U64(const Element& e, const char* attr) {
  auto it = e.attrs.find(attr);
  return it == e.attrs.end() ? UINT64_MAX : strtoull(it->second.c_str(), nullptr, 0);
}

std::string MallocInfoText(int options, int* result) {
  char* buf = nullptr;
  size_t len = 0;
  FILE* f = open_memstream(&buf, &len);
  *result = malloc_info(options, f);
  fclose(f);
  std::string text(buf, len);
  free(buf);
  return text;
}

TEST(GlibcCompat, MallocInfoWritesRdmallocsHeapAsXml) {
  int result = 0;
  errno = 0;
  EXPECT_EQ(MallocInfoText(1, &result), "");
  EXPECT_EQ(result, EINVAL);
  EXPECT_EQ(errno, 0);

  std::vector<void*> blocks;
  for (int i = 0; i < 10; i++) blocks.push_back(malloc(kMiB));
  // A registered class region, so that a region carries its keys.
  void* shared = rdmalloc_alloc(4096, RDMALLOC_REMOTE_READ | RDMALLOC_REMOTE_WRITE);
  rdmalloc_keys keys;
  ASSERT_EQ(rdmalloc_lookup(shared, 4096, nullptr, &keys), RDMALLOC_OK);
  std::string text = MallocInfoText(0, &result);
  struct rdmalloc_stats s = Stats();
  EXPECT_EQ(result, 0);
  XmlDoc doc = ParseXml(text);
  ASSERT_EQ(doc.error, "") << text;
  ASSERT_FALSE(doc.elements.empty());
  const Element& root = doc.elements[0];
  EXPECT_EQ(root.name, "malloc");
  EXPECT_EQ(Attr(root, "version"), "1");
  EXPECT_EQ(Attr(root, "allocator"), "rdmalloc") << text;
  std::map<std::string, const Element*> first;
  uint64_t region_bytes = 0;
  int regions = 0;
  bool keys_listed = false;
  for (const Element& e : doc.elements) {
    first.emplace(e.name + (e.attrs.count("type") ? ":" + e.attrs.at("type") : ""), &e);
    if (e.name == "region") {
      regions++;
      EXPECT_EQ(U64(e, "end") - U64(e, "begin"), U64(e, "size"));
      region_bytes += U64(e, "size");
    }
    if (e.name == "registration" && U64(e, "lkey") == keys.lkey && U64(e, "rkey") == keys.rkey) keys_listed = true;
  }
  ASSERT_TRUE(first.count("mallinfo2") && first.count("rdmalloc") && first.count("jemalloc") &&
              first.count("system:current"))
      << text;
  EXPECT_GE(U64(*first["mallinfo2"], "uordblks"), 10 * kMiB);
  EXPECT_GE(U64(*first["system:current"], "size"), s.bytes_mapped);
  EXPECT_GE(U64(*first["jemalloc"], "allocated"), 10 * kMiB);
  EXPECT_EQ(Attr(*first["rdmalloc"], "backend"), rdmalloc_backend());
  EXPECT_EQ(U64(*first["rdmalloc"], "regions_live"), s.regions_live);
  EXPECT_EQ(static_cast<uint64_t>(regions), s.regions_live) << text;
  EXPECT_EQ(region_bytes, s.bytes_mapped);
  EXPECT_TRUE(keys_listed) << "no region lists lkey " << keys.lkey << "\n" << text;
  for (void* b : blocks) free(b);
  free(shared);
  ExpectSameAsGlibc("malloc_info(");
}

TEST(GlibcCompat, MallocStatsPrintsRdmallocsHeap) {
  std::vector<void*> blocks;
  for (int i = 0; i < 10; i++) blocks.push_back(malloc(kMiB));
  fflush(stderr);
  FILE* capture = tmpfile();
  ASSERT_NE(capture, nullptr);
  int saved = dup(STDERR_FILENO);
  dup2(fileno(capture), STDERR_FILENO);
  malloc_stats();
  fflush(stderr);
  dup2(saved, STDERR_FILENO);
  close(saved);
  std::string text;
  rewind(capture);
  char line[256];
  size_t in_use = 0, system = 0;
  while (fgets(line, sizeof line, capture) != nullptr) {
    text += line;
    sscanf(line, "in use bytes = %zu", &in_use);  // the last block: the totals
    sscanf(line, "system bytes = %zu", &system);
  }
  fclose(capture);
  printf("%s", text.c_str());
  EXPECT_NE(text.find("rdmalloc"), std::string::npos) << text;
  EXPECT_GE(in_use, 10 * kMiB) << text;
  EXPECT_GE(system, in_use) << text;
  for (void* b : blocks) free(b);
}

}  // namespace
}  // namespace rdmalloc_test
