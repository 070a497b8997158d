// The heap on the verbs backend, with a stand-in libibverbs that mallocs
// inside ibv_reg_mr/ibv_dereg_mr (test/fake_ibverbs.cc): registration through
// the verbs API, and deregistration of regions that jemalloc releases inside
// its hooks moved out of hook context — under threads, without deadlock.
#include <dlfcn.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "test/test_util.h"

namespace rdmalloc_test {
namespace {

long VmLckKb() { return StatusKb("VmLck"); }

TEST(VerbsHeap, RegistersThroughVerbsAndDeregistersOutsideHooks) {
  ASSERT_STREQ(rdmalloc_backend(), "verbs");
  void* lib = dlopen(getenv("RDMALLOC_VERBS_LIBRARY"), RTLD_NOW | RTLD_NOLOAD);
  ASSERT_NE(lib, nullptr) << "rdmalloc did not load the stand-in libibverbs";
  auto live_mrs = reinterpret_cast<int (*)()>(dlsym(lib, "fake_ibverbs_live_mrs"));
  ASSERT_NE(live_mrs, nullptr);

  auto work = [](int id) {
    std::mt19937_64 rng(id);
    for (int i = 0; i < 1500; i++) {
      // Now and then a buffer larger than a region: a region of its own,
      // registered, then released by the next decay.
      size_t size = i % 25 == 0 ? size_t{72} << 20
                                : size_t{1} << std::uniform_int_distribution<int>(3, 23)(rng);
      void* p = malloc(size);
      rdmalloc_keys k;
      ASSERT_EQ(rdmalloc_lookup(p, size, nullptr, &k), RDMALLOC_OK);
      ASSERT_NE(k.mr, nullptr);
      EXPECT_EQ(k.handle, static_cast<void*>(k.mr));
      EXPECT_GE(k.lkey, 100u);
      EXPECT_EQ(k.rkey, k.lkey | 0x80000000u) << "keys come from the MR";
      char byte = 0;
      EXPECT_EQ(rdmalloc_dma_read(&k, 0, &byte, 1), RDMALLOC_ENOTSUP);
      free(p);
      if (i % 100 == 99) ForceDecay();  // releases happen inside jemalloc's hooks
    }
  };
  std::vector<std::thread> threads;
  for (int i = 0; i < 4; i++) threads.emplace_back(work, i);
  for (auto& t : threads) t.join();

  ForceDecay();
  struct rdmalloc_stats s = Stats();  // also performs queued deregistrations
  printf("verbs heap: %llu reg, %llu dereg, %llu releases deferred out of hooks, %d MRs live\n",
         (unsigned long long)s.reg_calls, (unsigned long long)s.dereg_calls,
         (unsigned long long)s.releases_deferred, live_mrs());
  EXPECT_GE(s.releases_deferred, 50u) << "releases from hook context were not exercised";
  EXPECT_GE(s.dereg_calls, 50u);
  EXPECT_EQ(s.reg_failures, 0u);
  EXPECT_EQ(static_cast<uint64_t>(live_mrs()), s.reg_calls - s.dereg_calls) << "MR leak";
  ASSERT_GE(VmLckKb(), 0) << "no VmLck in /proc/self/status";
  EXPECT_LE(VmLckKb(), static_cast<long>(s.bytes_registered >> 10) + 4) << "locked memory leak";
}

// From /proc/self/status, without a malloc (opendir would make one).
int ThreadsOfThisProcess() {
  char buf[4096];
  int fd = open("/proc/self/status", O_RDONLY);
  if (fd < 0) return -1;
  ssize_t n = read(fd, buf, sizeof buf - 1);
  close(fd);
  if (n <= 0) return -1;
  buf[n] = 0;
  const char* line = strstr(buf, "\nThreads:");
  return line == nullptr ? -1 : atoi(line + strlen("\nThreads:"));
}

// A fork child has no release thread; its first allocation starts it, even
// one that jemalloc's fast path would serve from the thread cache that the
// child inherited (rdmalloc turns the fast paths off until then).
TEST(VerbsHeap, AForkChildsFirstMallocStartsItsReleaseThread) {
  void* p = malloc(size_t{1} << 20);
  rdmalloc_keys k;
  ASSERT_EQ(rdmalloc_lookup(p, size_t{1} << 20, nullptr, &k), RDMALLOC_OK);  // verbs open
  free(p);
  for (int i = 0; i < 100; i++) {  // a cached 64-byte block to reuse (volatile: not elided)
    void* volatile cached = malloc(64);
    free(cached);
  }
  ASSERT_GE(ThreadsOfThisProcess(), 2) << "no release thread in the parent";
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    int before = ThreadsOfThisProcess();
    void* volatile q = malloc(64);
    int after = ThreadsOfThisProcess();
    free(q);
    if (before != 1 || after != 2) {
      fprintf(stderr, "child: %d thread(s) before its first malloc, %d after (want 1, 2)\n",
              before, after);
      _exit(1);
    }
    _exit(0);
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "the child's first malloc did not restart rdmalloc";
}

}  // namespace
}  // namespace rdmalloc_test
