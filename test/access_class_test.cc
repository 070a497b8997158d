// Access classes: the plain heap is local-only by default, remote rights come
// only with rdmalloc_alloc, and a class region never holds anything else.
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <new>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "allocator/rdmalloc.h"
#include "test/test_util.h"

namespace {

using rdmalloc_test::ForceDecay;
using rdmalloc_test::Stats;

constexpr unsigned kRW = RDMALLOC_REMOTE_READ | RDMALLOC_REMOTE_WRITE;

int Rights(unsigned flags) {
  return RDMALLOC_ACCESS_LOCAL_WRITE | ((flags & RDMALLOC_REMOTE_READ) ? RDMALLOC_ACCESS_REMOTE_READ : 0) |
         ((flags & RDMALLOC_REMOTE_WRITE) ? RDMALLOC_ACCESS_REMOTE_WRITE : 0) |
         ((flags & RDMALLOC_REMOTE_ATOMIC) ? RDMALLOC_ACCESS_REMOTE_ATOMIC : 0);
}

rdmalloc_keys Keys(const void* p, size_t n) {
  rdmalloc_keys k;
  memset(&k, 0, sizeof k);
  EXPECT_EQ(rdmalloc_lookup(p, n, nullptr, &k), RDMALLOC_OK) << p << "+" << n;
  return k;
}

// [base, base+len) of every region a key of class memory covered.
using Ranges = std::vector<std::pair<uintptr_t, uintptr_t>>;

bool Inside(const Ranges& ranges, const void* p, size_t n) {
  uintptr_t a = reinterpret_cast<uintptr_t>(p);
  for (auto [lo, hi] : ranges) {
    if (a < hi && a + n > lo) return true;
  }
  return false;
}

TEST(AccessClass, PlainHeapIsLocalOnlyAndRefusesRemoteAccess) {
  std::vector<uint8_t> probe(4096, 0x5a);
  for (size_t n : {size_t{64}, size_t{4096}, size_t{1} << 20}) {
    char* p = static_cast<char*>(malloc(n));
    memset(p, 1, n);
    rdmalloc_keys k = Keys(p, n);
    EXPECT_EQ(k.access, RDMALLOC_ACCESS_LOCAL_WRITE);
    size_t m = n < probe.size() ? n : probe.size();
    errno = 0;
    EXPECT_EQ(rdmalloc_dma_write(&k, 0, probe.data(), m), RDMALLOC_EDMA);
    EXPECT_EQ(errno, EACCES);
    EXPECT_EQ(p[0], 1) << "a refused write must not reach memory";
    errno = 0;
    EXPECT_EQ(rdmalloc_dma_read(&k, 0, probe.data(), m), RDMALLOC_EDMA);
    EXPECT_EQ(errno, EACCES);
    free(p);
  }
}

TEST(AccessClass, EveryClassIsRegisteredWithExactlyItsRights) {
  for (unsigned flags = 1; flags < 8; flags++) {
    SCOPED_TRACE(flags);
    size_t n = 1000 + flags;
    char* p = static_cast<char*>(rdmalloc_alloc(n, flags));
    ASSERT_NE(p, nullptr);
    memset(p, 0, n);
    rdmalloc_keys k = Keys(p, n);
    EXPECT_EQ(k.access, Rights(flags));
    std::vector<uint8_t> data(n), back(n);
    rdmalloc_test::FillPattern(data.data(), n, flags);
    int w = rdmalloc_dma_write(&k, 0, data.data(), n);
    int r = rdmalloc_dma_read(&k, 0, back.data(), n);
    if (flags & RDMALLOC_REMOTE_WRITE) {
      EXPECT_EQ(w, RDMALLOC_OK);
      EXPECT_EQ(memcmp(p, data.data(), n), 0) << "NIC -> CPU";
    } else {
      EXPECT_EQ(w, RDMALLOC_EDMA);
    }
    if (flags & RDMALLOC_REMOTE_READ) {
      EXPECT_EQ(r, RDMALLOC_OK);
      EXPECT_EQ(memcmp(p, back.data(), n), 0) << "CPU -> NIC";
    } else {
      EXPECT_EQ(r, RDMALLOC_EDMA);
    }
    free(p);
  }
}

// The security property: after any mix of class and plain allocations and
// frees (thread caches included), no plain buffer lies in a region that a
// remote key covers.
TEST(AccessClass, RemoteKeysNeverCoverPlainMemory) {
  Ranges remote;
  std::vector<std::pair<void*, size_t>> plain, cls;
  const size_t sizes[] = {8, 24, 64, 200, 1024, 4096, 20000, 70000, 300000, size_t{3} << 20};
  for (int round = 0; round < 40; round++) {
    for (size_t n : sizes) {
      void* c = rdmalloc_alloc(n, kRW);
      ASSERT_NE(c, nullptr);
      rdmalloc_keys k = Keys(c, n);
      uintptr_t base = reinterpret_cast<uintptr_t>(k.region_base);
      remote.emplace_back(base, base + k.region_len);
      cls.emplace_back(c, n);
      // Freed class blocks must not come back from malloc (tcache bypass).
      if (round % 2 == 0) {
        free(cls.back().first);
        cls.pop_back();
      }
      void* q = malloc(n);
      ASSERT_NE(q, nullptr);
      plain.emplace_back(q, n);
      void* cpp = ::operator new(n);
      plain.emplace_back(cpp, 0);  // 0: freed with delete below
    }
  }
  for (auto& [p, n] : plain) {
    EXPECT_FALSE(Inside(remote, p, n == 0 ? 1 : n)) << "plain " << p << " inside a remote region";
    if (n == 0) {
      ::operator delete(p);
    } else {
      free(p);
    }
  }
  // And the other way: keys of plain memory never carry remote rights.
  for (size_t n : sizes) {
    void* q = malloc(n);
    EXPECT_EQ(Keys(q, n).access, RDMALLOC_ACCESS_LOCAL_WRITE);
    free(q);
  }
  for (auto& [p, n] : cls) free(p);
}

TEST(AccessClass, FreedClassBlocksAreNotReusedByMallocOrNew) {
  // Same size class, same thread: jemalloc's tcache would hand the block
  // straight back if free() cached it.
  for (int i = 0; i < 1000; i++) {
    void* c = rdmalloc_alloc(48, RDMALLOC_REMOTE_WRITE);
    ASSERT_NE(c, nullptr);
    free(c);
    void* p = malloc(48);
    ASSERT_NE(p, c);
    void* q = ::operator new(48);
    ASSERT_NE(q, c);
    EXPECT_EQ(Keys(p, 48).access, RDMALLOC_ACCESS_LOCAL_WRITE);
    ::operator delete(q);
    free(p);
  }
  // C++'s sized and aligned deletes reach jemalloc's sized free paths.
  for (int i = 0; i < 1000; i++) {
    void* c = rdmalloc_alloc(48, RDMALLOC_REMOTE_WRITE);
    ASSERT_NE(c, nullptr);
    if (i % 2 == 0) {
      ::operator delete(c, size_t{48});
    } else {
      ::operator delete(c, size_t{48}, std::align_val_t{16});
    }
    void* q = ::operator new(48);
    ASSERT_NE(q, c) << (i % 2 == 0 ? "sized" : "sized aligned") << " delete cached a class block";
    ::operator delete(q, size_t{48});
  }
}

// A thread that freed (and so has a fast free path) before the first class
// allocation in the process frees class blocks past its cache all the same:
// free's fast path is jemalloc's own, with no class check, and starting
// classes holds every thread's free fast path off (third_party/
// jemalloc_rdmalloc.patch). In a fresh process, where no class exists yet.
TEST(AccessClass, ThreadsStartedBeforeClassesExistKeepClassBlocksOutOfTheirCaches) {
  if (!rdmalloc_test::IsRerunChild()) {
    EXPECT_EQ(rdmalloc_test::RerunSelf(
                  "AccessClass.ThreadsStartedBeforeClassesExistKeepClassBlocksOutOfTheirCaches",
                  {}),
              0);
    return;
  }
  constexpr int kBlocks = 64;
  std::atomic<int> stage{0};
  std::vector<void*> blocks(kBlocks);
  std::atomic<int> cached{0}, plain_rights_wrong{0};
  std::thread early([&] {
    // Nothing between the classes' start and the frees may allocate: an
    // allocation can trigger a thread event, whose recompute would catch
    // up with the classes anyway.
    std::vector<void*> plain;
    plain.reserve(4 * kBlocks);
    for (int i = 0; i < 10000; i++) free(malloc(48));  // a warm cache, a fast free path
    stage.store(1);
    while (stage.load() != 2) std::this_thread::yield();
    for (int i = 0; i < kBlocks; i++) {
      if (i % 2 == 0) {
        free(blocks[i]);
      } else {
        ::operator delete(blocks[i], size_t{48});
      }
    }
    for (int i = 0; i < 4 * kBlocks; i++) plain.push_back(i % 2 == 0 ? malloc(48) : ::operator new(48));
    for (void* p : plain) {
      if (std::find(blocks.begin(), blocks.end(), p) != blocks.end()) cached++;
      if (Keys(p, 48).access != RDMALLOC_ACCESS_LOCAL_WRITE) plain_rights_wrong++;
    }
    for (void* p : plain) free(p);
  });
  while (stage.load() != 1) std::this_thread::yield();
  for (void*& b : blocks) {
    b = rdmalloc_alloc(48, RDMALLOC_REMOTE_WRITE);
    ASSERT_NE(b, nullptr);
  }
  stage.store(2);
  early.join();
  EXPECT_EQ(cached.load(), 0) << "class blocks came back from a thread cache";
  EXPECT_EQ(plain_rights_wrong.load(), 0);
}

// jemalloc's own API with an explicit thread cache: class memory still
// bypasses it (a cached class block would be handed to a plain mallocx).
TEST(AccessClass, ExplicitTcacheFlagsDoNotCacheClassMemory) {
  unsigned tc = 0;
  size_t len = sizeof tc;
  ASSERT_EQ(mallctl("tcache.create", &tc, &len, nullptr, 0), 0);
  for (int i = 0; i < 200; i++) {
    void* c = rdmalloc_alloc(96, RDMALLOC_REMOTE_READ);
    ASSERT_NE(c, nullptr);
    if (i % 2 == 0) {
      dallocx(c, MALLOCX_TCACHE(tc));
    } else {
      sdallocx(c, 96, MALLOCX_TCACHE(tc));
    }
    void* p = mallocx(96, MALLOCX_TCACHE(tc));
    ASSERT_NE(p, c) << "a class block came back from a thread cache";
    EXPECT_EQ(Keys(p, 96).access, RDMALLOC_ACCESS_LOCAL_WRITE);
    dallocx(p, MALLOCX_TCACHE(tc));
  }
  void* c = rdmalloc_alloc(96, RDMALLOC_REMOTE_READ);
  void* grown = rallocx(c, 5000, MALLOCX_TCACHE(tc));
  ASSERT_NE(grown, nullptr);
  EXPECT_EQ(Keys(grown, 5000).access, Rights(RDMALLOC_REMOTE_READ)) << "rallocx keeps the class";
  dallocx(grown, MALLOCX_TCACHE(tc));
  mallctl("tcache.destroy", nullptr, nullptr, &tc, sizeof tc);
}

TEST(AccessClass, ReallocKeepsTheClassAndTheBytes) {
  char* p = static_cast<char*>(rdmalloc_alloc(100, kRW));
  ASSERT_NE(p, nullptr);
  rdmalloc_test::FillPattern(p, 100, 7);
  for (size_t n : {size_t{1000}, size_t{100000}, size_t{5} << 20, size_t{50}}) {
    size_t keep = n < 100 ? n : 100;
    char* q = static_cast<char*>(realloc(p, n));
    ASSERT_NE(q, nullptr);
    EXPECT_TRUE(rdmalloc_test::HasPattern(q, keep, 7)) << n;
    EXPECT_EQ(Keys(q, n).access, Rights(kRW)) << n;
    p = q;
  }
  EXPECT_EQ(realloc(p, 0), nullptr);  // frees, as glibc's realloc does
}

TEST(AccessClass, AlignedAllocAndArgumentErrors) {
  for (size_t align : {size_t{64}, size_t{4096}, size_t{1} << 16, size_t{2} << 20}) {
    void* p = rdmalloc_aligned_alloc(align, 3000, RDMALLOC_REMOTE_READ);
    ASSERT_NE(p, nullptr);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % align, 0u);
    EXPECT_EQ(Keys(p, 3000).access, Rights(RDMALLOC_REMOTE_READ));
    free(p);
  }
  errno = 0;
  EXPECT_EQ(rdmalloc_alloc(64, 1u << 7), nullptr);
  EXPECT_EQ(errno, EINVAL);
  errno = 0;
  EXPECT_EQ(rdmalloc_aligned_alloc(48, 64, RDMALLOC_REMOTE_READ), nullptr);
  EXPECT_EQ(errno, EINVAL);
  void* plain = rdmalloc_alloc(64, 0);  // flags 0 is malloc
  ASSERT_NE(plain, nullptr);
  EXPECT_EQ(Keys(plain, 64).access, RDMALLOC_ACCESS_LOCAL_WRITE);
  free(plain);
  void* zero = rdmalloc_alloc(0, RDMALLOC_REMOTE_WRITE);
  EXPECT_NE(zero, nullptr);
  free(zero);
}

TEST(AccessClass, ClassRegionsAreReleasedWhenEmpty) {
  ForceDecay();
  struct rdmalloc_stats before = Stats();
  std::vector<void*> blocks;
  for (int i = 0; i < 64; i++) blocks.push_back(rdmalloc_alloc(size_t{1} << 20, kRW));
  for (void* b : blocks) {
    ASSERT_NE(b, nullptr);
    Keys(b, size_t{1} << 20);
  }
  struct rdmalloc_stats during = Stats();
  EXPECT_GT(during.regions_live, before.regions_live);
  EXPECT_GE(during.bytes_registered, before.bytes_registered + (size_t{64} << 20));
  for (void* b : blocks) free(b);
  ForceDecay();
  struct rdmalloc_stats after = Stats();
  EXPECT_LE(after.bytes_registered, before.bytes_registered)
      << "class regions must be deregistered once empty";
  EXPECT_LE(after.regions_live, before.regions_live);
}

TEST(AccessClass, ThreadsMixingClassesAndPlainNeverShareRegions) {
  constexpr int kThreads = 4;
  std::vector<std::thread> threads;
  std::atomic<int> violations{0};
  for (int t = 0; t < kThreads; t++) {
    threads.emplace_back([t, &violations] {
      unsigned flags = static_cast<unsigned>(t % 7) + 1;
      std::vector<std::pair<void*, size_t>> mine;
      Ranges remote;
      for (int i = 0; i < 3000; i++) {
        size_t n = 16 + (static_cast<size_t>(i) * 977 + t * 131) % 60000;
        void* c = rdmalloc_alloc(n, flags);
        rdmalloc_keys k;
        if (c == nullptr || rdmalloc_lookup(c, n, nullptr, &k) != RDMALLOC_OK ||
            k.access != Rights(flags)) {
          violations++;
          continue;
        }
        uintptr_t base = reinterpret_cast<uintptr_t>(k.region_base);
        if (remote.empty() || remote.back().first != base) remote.emplace_back(base, base + k.region_len);
        void* p = malloc(n);
        if (Inside(remote, p, n)) violations++;
        mine.emplace_back(c, n);
        free(p);
        if (i % 3 == 0) {
          free(mine.front().first);
          mine.erase(mine.begin());
        }
      }
      for (auto& [c, n] : mine) free(c);
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(violations.load(), 0);
}

// Lines of rdmalloc_dump_regions.
std::vector<std::string> DumpLines() {
  std::vector<std::string> lines;
  char* text = nullptr;
  size_t len = 0;
  FILE* f = open_memstream(&text, &len);
  rdmalloc_dump_regions(f);
  fclose(f);
  std::string all(text, len);
  free(text);
  size_t at = 0;
  while (at < all.size()) {
    size_t nl = all.find('\n', at);
    if (nl == std::string::npos) nl = all.size();
    lines.push_back(all.substr(at, nl - at));
    at = nl + 1;
  }
  return lines;
}

// jemalloc's metadata (arena structs, extent descriptors) never lives in
// rdmalloc's regions: every arena is made with its metadata off the hooks, so
// no key covers allocator state, and metadata, which is never freed, never
// keeps a region. Making arenas (class arenas, arenas.create) maps no region
// until memory is asked of them; eager registration then pins data only.
TEST(AccessClass, MetadataNeverLivesInTheHeap) {
  if (getenv("TEST_RERUN_CHILD") == nullptr) {
    EXPECT_EQ(rdmalloc_test::RerunSelf("AccessClass.MetadataNeverLivesInTheHeap",
                                       {"RDMALLOC_REGISTER=eager"}),
              0)
        << "eager";
  }
  uint64_t regions = rdmalloc_test::Stats().regions_created;
  uint64_t in_use = rdmalloc_test::Stats().bytes_in_use;
  std::vector<unsigned> made;
  for (int i = 0; i < 4; i++) {
    unsigned ind = 0;
    size_t len = sizeof ind;
    ASSERT_EQ(mallctl("arenas.create", &ind, &len, nullptr, 0), 0);
    made.push_back(ind);
  }
  EXPECT_EQ(rdmalloc_test::Stats().regions_created, regions) << "arena metadata made a region";
  EXPECT_EQ(rdmalloc_test::Stats().bytes_in_use, in_use) << "arena metadata came through the hooks";
  for (unsigned flags = 1; flags < 8; flags++) {
    void* p = rdmalloc_alloc(100, flags);  // makes the class arena, then a region for the block
    ASSERT_NE(p, nullptr);
    Keys(p, 100);
    free(p);
  }
  for (const std::string& line : DumpLines()) {
    EXPECT_EQ(line.find("metadata"), std::string::npos) << line;
    if (getenv("TEST_RERUN_CHILD") != nullptr) {
      EXPECT_NE(line.find("domain 0"), std::string::npos) << "eager: " << line;
    }
  }
  for (unsigned ind : made) {
    char name[64];
    snprintf(name, sizeof name, "arena.%u.destroy", ind);
    EXPECT_EQ(mallctl(name, nullptr, nullptr, nullptr, 0), 0);
  }
}

// Huge alignments and sizes (2 MiB-aligned whole huge pages, the shape of
// jemalloc's metadata blocks) give registrable memory with the class's rights.
TEST(AccessClass, HugeAlignedBuffersAreRegisteredWithTheirRights) {
  for (size_t align = size_t{2} << 20; align <= (size_t{8} << 20); align <<= 1) {
    for (size_t n = size_t{2} << 20; n <= (size_t{16} << 20); n <<= 1) {
      void* p = nullptr;
      ASSERT_EQ(posix_memalign(&p, align, n), 0);
      Keys(p, n);
      free(p);
      void* c = rdmalloc_aligned_alloc(align, n, RDMALLOC_REMOTE_WRITE);
      ASSERT_NE(c, nullptr);
      EXPECT_EQ(Keys(c, n).access, Rights(RDMALLOC_REMOTE_WRITE));
      free(c);
    }
  }
}

// RDMALLOC_ACCESS may widen the plain heap for legacy code; the report says so.
TEST(AccessClass, WideningThePlainHeapIsWarnedAboutInTheReport) {
  if (getenv("TEST_RERUN_CHILD") != nullptr) {
    void* p = malloc(4096);
    EXPECT_EQ(Keys(p, 4096).access, RDMALLOC_ACCESS_LOCAL_WRITE | RDMALLOC_ACCESS_REMOTE_READ |
                                        RDMALLOC_ACCESS_REMOTE_WRITE);
    free(p);
    return;
  }
  auto report = [](const char* test, const char* access_env) {
    std::string path = std::string(getenv("TEST_TMPDIR") ? getenv("TEST_TMPDIR") : "/tmp") +
                       "/access_report_" + std::to_string(getpid()) + ".txt";
    unlink(path.c_str());
    std::vector<std::string> env = {"RDMALLOC_STATS=1", "RDMALLOC_STATS_FILE=" + path};
    if (access_env != nullptr) env.push_back(access_env);
    EXPECT_EQ(rdmalloc_test::RerunSelf(test, env), 0) << test;
    std::string text;
    if (FILE* f = fopen(path.c_str(), "r")) {
      char buf[4096];
      size_t n;
      while ((n = fread(buf, 1, sizeof buf, f)) > 0) text.append(buf, n);
      fclose(f);
    }
    unlink(path.c_str());
    return text;
  };
  std::string wide = report("AccessClass.WideningThePlainHeapIsWarnedAboutInTheReport",
                            "RDMALLOC_ACCESS=local_write,remote_read,remote_write");
  EXPECT_NE(wide.find("WARNING: RDMALLOC_ACCESS widened it"), std::string::npos) << wide;
  std::string plain = report("AccessClass.PlainHeapIsLocalOnlyAndRefusesRemoteAccess", nullptr);
  EXPECT_NE(plain.find("plain heap local_write (local only"), std::string::npos) << plain;
  EXPECT_EQ(plain.find("WARNING"), std::string::npos) << plain;
}

}  // namespace
