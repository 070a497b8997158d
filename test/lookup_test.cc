// Every pointer any allocation function returns, from any thread, resolves
// through rdmalloc_lookup to registered keys; everything else gets the right,
// distinct error.
#include <gtest/gtest.h>
#include <linux/seccomp.h>
#include <malloc.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <spawn.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <new>
#include <string>
#include <thread>
#include <vector>

#include "test/page_oracle.h"
#include "test/test_util.h"

namespace rdmalloc_test {
namespace {

struct Allocation {
  std::string how;
  void* p;
  size_t size;
  std::function<void(void*)> release;
};

std::vector<Allocation> AllocateEveryWay(size_t size) {
  std::vector<Allocation> v;
  auto c_free = [](void* p) { free(p); };
  v.push_back({"malloc", malloc(size), size, c_free});
  v.push_back({"calloc", calloc(1, size), size, c_free});
  void* r = malloc(size / 2 + 1);
  v.push_back({"realloc", realloc(r, size), size, c_free});
  void* pm = nullptr;
  EXPECT_EQ(posix_memalign(&pm, 4096, size), 0);
  v.push_back({"posix_memalign", pm, size, c_free});
  pm = nullptr;
  EXPECT_EQ(posix_memalign(&pm, size_t{2} << 20, size), 0);
  v.push_back({"posix_memalign(2M)", pm, size, c_free});
  v.push_back({"aligned_alloc", aligned_alloc(64, (size + 63) & ~size_t{63}), size, c_free});
  v.push_back({"memalign", memalign(256, size), size, c_free});
  v.push_back({"valloc", valloc(size), size, c_free});
  v.push_back({"pvalloc", pvalloc(size), size, c_free});
  v.push_back({"mallocx", mallocx(size, 0), size, c_free});
  v.push_back({"strdup", nullptr, 0, c_free});
  std::string s(size > 1 ? size - 1 : 1, 'x');
  v.back().p = strdup(s.c_str());
  v.back().size = s.size() + 1;
  v.push_back({"new[]", new char[size], size, [](void* p) { delete[] static_cast<char*>(p); }});
  v.push_back({"new(nothrow)[]", new (std::nothrow) char[size], size,
               [](void* p) { delete[] static_cast<char*>(p); }});
  v.push_back({"new(align)", ::operator new(size, std::align_val_t(4096)), size,
               [](void* p) { ::operator delete(p, std::align_val_t(4096)); }});
  v.push_back({"new", ::operator new(size), size, [](void* p) { ::operator delete(p); }});
  return v;
}

void LookupEverything() {
  for (size_t size : {size_t{1}, size_t{8}, size_t{100}, size_t{4096}, size_t{40000},
                      size_t{1} << 20, size_t{9} << 20, size_t{64} << 20}) {
    for (Allocation& a : AllocateEveryWay(size)) {
      ASSERT_NE(a.p, nullptr) << a.how;
      rdmalloc_keys k;
      ASSERT_EQ(rdmalloc_lookup(a.p, a.size, nullptr, &k), RDMALLOC_OK) << a.how << " " << size;
      EXPECT_GE(reinterpret_cast<uintptr_t>(a.p), reinterpret_cast<uintptr_t>(k.region_base));
      EXPECT_LE(reinterpret_cast<uintptr_t>(a.p) + a.size,
                reinterpret_cast<uintptr_t>(k.region_base) + k.region_len);
      EXPECT_EQ(k.addr, a.p);
      EXPECT_EQ(k.len, a.size);
      // The whole usable size is inside the same registration.
      EXPECT_EQ(rdmalloc_lookup(a.p, malloc_usable_size(a.p), nullptr, &k), RDMALLOC_OK) << a.how;
      size_t n = std::min<size_t>(a.size, 512);
      EXPECT_TRUE(CheckPageIdentity(a.p, a.size, a.size - n, n, size).ok) << a.how;
      a.release(a.p);
    }
  }
}

TEST(Lookup, EveryAllocationFunctionOnTheMainThread) { LookupEverything(); }

TEST(Lookup, EveryAllocationFunctionFromEveryThread) {
  std::vector<std::thread> threads;
  for (int i = 0; i < 8; i++) threads.emplace_back(LookupEverything);
  for (auto& t : threads) t.join();
  // Every automatic arena served someone, all through our hooks.
  EXPECT_EQ(Stats().foreign_extents, 0u);
}

TEST(Lookup, MemoryFromAnArenaCreatedLaterIsOurs) {
  unsigned arena = 0;
  size_t len = sizeof arena;
  ASSERT_EQ(mallctl("arenas.create", &arena, &len, nullptr, 0), 0);
  void* p = mallocx(100000, MALLOCX_ARENA(arena) | MALLOCX_TCACHE_NONE);
  ASSERT_NE(p, nullptr);
  rdmalloc_keys k;
  EXPECT_EQ(rdmalloc_lookup(p, 100000, nullptr, &k), RDMALLOC_OK);
  dallocx(p, MALLOCX_TCACHE_NONE);
}

// The hit path (the default domain's slot, copied a pair of fields at a
// time) answers as the slow path that registered the region did, field for
// field.
TEST(Lookup, HitPathGivesTheSameKeysAgain) {
  const size_t n = size_t{80} << 20;  // past RDMALLOC_REGION_SIZE: a region of its own
  char* p = static_cast<char*>(malloc(n));
  ASSERT_NE(p, nullptr);
  rdmalloc_keys a, b;
  memset(&a, 0xa5, sizeof a);
  memset(&b, 0x5a, sizeof b);
  uint64_t slow = Stats().lookup_slow;
  ASSERT_EQ(rdmalloc_lookup(p + 10, 1000, nullptr, &a), RDMALLOC_OK);
  ASSERT_GT(Stats().lookup_slow, slow) << "the first lookup registers the new region";
  slow = Stats().lookup_slow;
  ASSERT_EQ(rdmalloc_lookup(p + 10, 1000, nullptr, &b), RDMALLOC_OK);
  EXPECT_EQ(Stats().lookup_slow, slow) << "a registered region must not take the slow path";
  EXPECT_EQ(a.lkey, b.lkey);
  EXPECT_EQ(a.rkey, b.rkey);
  EXPECT_EQ(a.mr, b.mr);
  EXPECT_EQ(a.handle, b.handle);
  EXPECT_NE(b.handle, nullptr);
  EXPECT_EQ(a.region_base, b.region_base);
  EXPECT_EQ(a.region_len, b.region_len);
  EXPECT_GE(b.region_len, n);
  EXPECT_EQ(b.addr, p + 10);
  EXPECT_EQ(b.len, 1000u);
  EXPECT_EQ(a.addr, b.addr);
  EXPECT_EQ(a.len, b.len);
  EXPECT_EQ(b.reg_errno, 0);
  EXPECT_EQ(b.domain, 0);
  EXPECT_EQ(a.access, b.access);
  EXPECT_NE(b.access, 0);
  free(p);
}

// The hit path's promise, checked by the kernel: in a child under strict
// seccomp (only read/write/exit allowed) any system call kills it; jemalloc's
// per-thread byte counter shows any allocation.
TEST(Lookup, HitPathMakesNoSystemCallAndAllocatesNothing) {
  void* p = malloc(4096);
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    rdmalloc_keys k;
    // The child forgot the parent's registrations: register here first.
    if (rdmalloc_lookup(p, 4096, nullptr, &k) != RDMALLOC_OK) syscall(SYS_exit, 2);
    uint64_t* allocated = nullptr;
    size_t len = sizeof allocated;
    if (mallctl("thread.allocatedp", &allocated, &len, nullptr, 0) != 0) syscall(SYS_exit, 3);
    uint64_t before = *allocated;
    if (prctl(PR_SET_SECCOMP, SECCOMP_MODE_STRICT) != 0) syscall(SYS_exit, 4);
    int bad = 0;
    for (int i = 0; i < 10000; i++) bad += rdmalloc_lookup(p, 4096, nullptr, &k) != RDMALLOC_OK;
    syscall(SYS_exit, bad != 0 ? 5 : *allocated != before ? 6 : 0);
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_FALSE(WIFSIGNALED(status)) << "killed by signal " << WTERMSIG(status)
                                    << ": the hit path made a system call";
  EXPECT_EQ(WEXITSTATUS(status), 0) << "2: setup lookup, 5: hit lookups failed, 6: allocated";
  free(p);
}

int g_static_buffer[64];

TEST(LookupErrors, NotRdmallocMemory) {
  rdmalloc_keys k;
  int on_stack[16];
  EXPECT_EQ(rdmalloc_lookup(on_stack, sizeof on_stack, nullptr, &k), RDMALLOC_ENOTOURS);
  EXPECT_EQ(rdmalloc_lookup(g_static_buffer, sizeof g_static_buffer, nullptr, &k), RDMALLOC_ENOTOURS);
  EXPECT_EQ(rdmalloc_lookup(nullptr, 1, nullptr, &k), RDMALLOC_ENOTOURS);
  void* foreign = mmap(nullptr, 1 << 20, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(foreign, MAP_FAILED);
  EXPECT_EQ(rdmalloc_lookup(foreign, 100, nullptr, &k), RDMALLOC_ENOTOURS);
  munmap(foreign, 1 << 20);
}

// From p to the end of the region its keys describe.
size_t BytesToRegionEnd(const void* p, const rdmalloc_keys& k) {
  return reinterpret_cast<uintptr_t>(k.region_base) + k.region_len - reinterpret_cast<uintptr_t>(p);
}

TEST(LookupErrors, RangeCrossingTheRegion) {
  void* p = malloc(100);
  rdmalloc_keys k;
  ASSERT_EQ(rdmalloc_lookup(p, 100, nullptr, &k), RDMALLOC_OK);
  size_t to_end = BytesToRegionEnd(p, k);
  EXPECT_EQ(rdmalloc_lookup(p, to_end, nullptr, &k), RDMALLOC_OK);
  EXPECT_EQ(rdmalloc_lookup(p, to_end + 1, nullptr, &k), RDMALLOC_ECROSS);
  free(p);
}

// rdmalloc_owns answers what a lookup would, without registering: heap
// ranges inside one region are owned; stack, static, foreign mmap, NULL and
// a range running out of its region are not.
TEST(Owns, HeapRangesInsideOneRegionOnly) {
  void* p = malloc(100);
  rdmalloc_keys k;
  ASSERT_EQ(rdmalloc_lookup(p, 100, nullptr, &k), RDMALLOC_OK);
  size_t to_end = BytesToRegionEnd(p, k);
  EXPECT_EQ(rdmalloc_owns(p, 100), 1);
  EXPECT_EQ(rdmalloc_owns(p, to_end), 1);
  EXPECT_EQ(rdmalloc_owns(p, to_end + 1), 0);
  EXPECT_EQ(rdmalloc_owns(p, SIZE_MAX), 0);
  int on_stack[16];
  EXPECT_EQ(rdmalloc_owns(on_stack, sizeof on_stack), 0);
  EXPECT_EQ(rdmalloc_owns(g_static_buffer, sizeof g_static_buffer), 0);
  EXPECT_EQ(rdmalloc_owns(nullptr, 1), 0);
  void* foreign = mmap(nullptr, 1 << 20, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(foreign, MAP_FAILED);
  EXPECT_EQ(rdmalloc_owns(foreign, 100), 0);
  munmap(foreign, 1 << 20);
  free(p);
}

TEST(LookupErrors, BadArguments) {
  void* p = malloc(100);
  rdmalloc_keys k;
  EXPECT_EQ(rdmalloc_lookup(p, 100, nullptr, nullptr), RDMALLOC_EINVAL);
  EXPECT_EQ(rdmalloc_lookup(p, SIZE_MAX, nullptr, &k), RDMALLOC_EINVAL);
  int not_added;
  EXPECT_EQ(rdmalloc_lookup(p, 100, reinterpret_cast<ibv_pd*>(&not_added), &k), RDMALLOC_EINVAL);
  EXPECT_EQ(rdmalloc_add_pd(nullptr, 0), RDMALLOC_EINVAL);
  EXPECT_EQ(rdmalloc_add_pd(reinterpret_cast<ibv_pd*>(&not_added), 1 << 30), RDMALLOC_EINVAL);
  EXPECT_EQ(rdmalloc_remove_pd(reinterpret_cast<ibv_pd*>(&not_added)), RDMALLOC_EINVAL);
  EXPECT_EQ(rdmalloc_dma_read(nullptr, 0, &k, 1), RDMALLOC_EINVAL);
  ASSERT_EQ(rdmalloc_lookup(p, 100, nullptr, &k), RDMALLOC_OK);
  char buf[200];
  EXPECT_EQ(rdmalloc_dma_read(&k, 50, buf, 51), RDMALLOC_EINVAL) << "beyond the looked-up range";
  EXPECT_EQ(rdmalloc_stats(nullptr, 0), RDMALLOC_EINVAL);
  free(p);
}

// Registration failure needs a process whose backend cannot register: rerun
// this binary with RDMALLOC_BACKEND=none and only the child test.
TEST(LookupErrors, RegistrationFailedCarriesErrno) {
  if (IsRerunChild()) {
    void* p = malloc(100);
    rdmalloc_keys k;
    errno = 0;
    ASSERT_EQ(rdmalloc_lookup(p, 100, nullptr, &k), RDMALLOC_EREGFAIL);
    EXPECT_EQ(k.reg_errno, ENODEV);
    EXPECT_EQ(errno, ENODEV);
    EXPECT_STREQ(rdmalloc_backend(), "none");
    EXPECT_EQ(Stats().lookup_reg_failed, 1u);
    free(p);
    exit(::testing::Test::HasFailure() ? 1 : 0);
  }
  EXPECT_EQ(RerunSelf("LookupErrors.RegistrationFailedCarriesErrno", {"RDMALLOC_BACKEND=none"}), 0);
}

}  // namespace
}  // namespace rdmalloc_test
