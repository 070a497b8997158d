// rdmalloc_on_release: observers hear of every range rdmalloc gives back to
// the OS, exactly once, while the addresses are still mapped, never in hook
// context, and never for memory rdmalloc still keeps.
#include <dirent.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <fstream>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "allocator/rdmalloc.h"
#include "test/test_util.h"

namespace {

using rdmalloc_test::ForceDecay;
using rdmalloc_test::Stats;

// Larger than any shared region (RDMALLOC_REGION_SIZE, 32 MiB by default):
// gets a dedicated region, released as a whole when freed and decayed.
constexpr size_t kBig = size_t{40} << 20;

// A malloc whose result is never used may be optimised away with its free.
void* MallocUsed(size_t n, int fill) {
  void* p = malloc(n);
  memset(p, fill, n);
  asm volatile("" : : "r"(p) : "memory");
  return p;
}

struct Seen {
  std::mutex mu;
  std::vector<std::pair<uintptr_t, size_t>> ranges;
  std::atomic<int> still_mapped_failures{0};
  std::atomic<int> still_registered{0};
  std::atomic<int> malloc_in_callback_failed{0};
};

void Record(void* addr, size_t len, void* arg) {
  auto* seen = static_cast<Seen*>(arg);
  // Still mapped: msync fails with ENOMEM on unmapped addresses.
  if (msync(addr, len, MS_ASYNC) != 0) seen->still_mapped_failures++;
  // Already unregistered and out of the map: rdmalloc no longer knows it.
  rdmalloc_keys k;
  if (rdmalloc_lookup(addr, 1, nullptr, &k) != RDMALLOC_ENOTOURS) seen->still_registered++;
  // Observers may allocate (UCX's and libfabric's do).
  void* p = malloc(100);
  if (p == nullptr) seen->malloc_in_callback_failed++;
  free(p);
  std::lock_guard<std::mutex> g(seen->mu);
  seen->ranges.emplace_back(reinterpret_cast<uintptr_t>(addr), len);
}

bool Covered(Seen& seen, uintptr_t base, size_t len) {
  std::lock_guard<std::mutex> g(seen.mu);
  for (auto [a, n] : seen.ranges)
    if (a == base && n == len) return true;
  return false;
}

int CountFor(Seen& seen, uintptr_t base) {
  std::lock_guard<std::mutex> g(seen.mu);
  int c = 0;
  for (auto [a, n] : seen.ranges) c += a == base;
  return c;
}

// Releases from hook context reach the observer through rdmalloc's release
// thread: give it a moment.
bool WaitFor(Seen& seen, uintptr_t base, size_t len) {
  for (int i = 0; i < 500; i++) {
    if (Covered(seen, base, len)) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return false;
}

TEST(OnRelease, NotifiedOnceWhenTheRegionGoesBackNeverEarlier) {
  Seen seen;
  ASSERT_EQ(rdmalloc_on_release(Record, &seen), RDMALLOC_OK);
  EXPECT_EQ(rdmalloc_on_release(Record, &seen), RDMALLOC_EINVAL) << "twice";
  // Two blocks in one region of an access class nothing else here uses, so
  // that the region's fate depends on them alone.
  constexpr size_t kBlock = 600 << 10;
  char* a = static_cast<char*>(rdmalloc_alloc(kBlock, RDMALLOC_REMOTE_ATOMIC));
  char* b = static_cast<char*>(rdmalloc_alloc(kBlock, RDMALLOC_REMOTE_ATOMIC));
  ASSERT_TRUE(a != nullptr && b != nullptr);
  memset(a, 1, kBlock);
  memset(b, 1, kBlock);
  rdmalloc_keys ka, kb;
  ASSERT_EQ(rdmalloc_lookup(a, kBlock, nullptr, &ka), RDMALLOC_OK);
  ASSERT_EQ(rdmalloc_lookup(b, kBlock, nullptr, &kb), RDMALLOC_OK);
  ASSERT_EQ(ka.region_base, kb.region_base) << "expected one region for both blocks";
  uintptr_t base = reinterpret_cast<uintptr_t>(ka.region_base);
  size_t len = ka.region_len;
  free(a);
  ForceDecay();
  // b still lives there: the memory has not left the process, so no
  // observer may drop anything yet.
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  EXPECT_EQ(CountFor(seen, base), 0) << "notified while the region was still in use";
  free(b);
  ForceDecay();
  ASSERT_TRUE(WaitFor(seen, base, len)) << "no notification for the released region";
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_EQ(CountFor(seen, base), 1) << "exactly once";
  EXPECT_EQ(seen.still_mapped_failures.load(), 0) << "called after munmap";
  EXPECT_EQ(seen.still_registered.load(), 0) << "called before rdmalloc's own deregistration";
  EXPECT_EQ(seen.malloc_in_callback_failed.load(), 0);
  struct rdmalloc_stats s = Stats();
  EXPECT_GE(s.releases_notified, 1u);
  EXPECT_EQ(s.observers, 1u);
  ASSERT_EQ(rdmalloc_on_release_remove(Record, &seen), RDMALLOC_OK);
  EXPECT_EQ(rdmalloc_on_release_remove(Record, &seen), RDMALLOC_EINVAL) << "not registered";
  EXPECT_EQ(Stats().observers, 0u);
}

TEST(OnRelease, RunsOnTheReleaseThreadNotInsideFree) {
  static std::atomic<pid_t> caller{0};
  auto cb = [](void*, size_t, void*) { caller = static_cast<pid_t>(gettid()); };
  ASSERT_EQ(rdmalloc_on_release(cb, nullptr), RDMALLOC_OK);
  caller = 0;
  void* p = MallocUsed(kBig, 2);
  free(p);
  ForceDecay();  // the release happens in jemalloc's hooks, in this thread
  for (int i = 0; i < 500 && caller.load() == 0; i++)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  ASSERT_NE(caller.load(), 0);
  EXPECT_NE(caller.load(), static_cast<pid_t>(gettid())) << "observer ran in hook context";
  std::ifstream comm("/proc/self/task/" + std::to_string(caller.load()) + "/comm");
  std::string name;
  std::getline(comm, name);
  EXPECT_EQ(name, "rdmalloc-rel");
  ASSERT_EQ(rdmalloc_on_release_remove(cb, nullptr), RDMALLOC_OK);
}

// With an observer, freed pages of a partly used region stay resident: the
// observer may have registered them itself, and a purge would leave its MR on
// the old pages. (Without one they are purged: Lifecycle test.)
TEST(OnRelease, FreedPagesAreNotPurgedWhileObserversExist) {
  Seen seen;
  ASSERT_EQ(rdmalloc_on_release(Record, &seen), RDMALLOC_OK);
  // Keep the region alive with a small block, free a big neighbour.
  std::vector<void*> keep;
  void* mem = nullptr;
  ASSERT_EQ(posix_memalign(&mem, 4096, size_t{8} << 20), 0);  // mincore wants pages
  char* big = static_cast<char*>(mem);
  keep.push_back(malloc(64 << 10));
  memset(big, 3, size_t{8} << 20);
  asm volatile("" : : "r"(big) : "memory");  // the stores must happen
  rdmalloc_keys k;
  // The region is never registered by rdmalloc (no lookup of it): exactly
  // the case where rdmalloc would purge.
  free(big);
  ForceDecay();
  const size_t page = 4096;
  std::vector<unsigned char> vec((size_t{8} << 20) / page);
  if (mincore(big, size_t{8} << 20, vec.data()) == 0) {
    size_t resident = 0;
    for (unsigned char v : vec) resident += v & 1;
    EXPECT_EQ(resident, vec.size()) << "freed pages were purged behind an observer's back";
  } else {
    // The whole region went back (then the observer heard of it).
    EXPECT_EQ(errno, ENOMEM);
    EXPECT_TRUE(rdmalloc_lookup(big, 1, nullptr, &k) == RDMALLOC_ENOTOURS);
  }
  for (void* p : keep) free(p);
  ASSERT_EQ(rdmalloc_on_release_remove(Record, &seen), RDMALLOC_OK);
}

TEST(OnRelease, RemoveWaitsForARunningCallbackAndACallbackMayRemoveItself) {
  static std::atomic<int> inside{0}, calls{0};
  static std::atomic<bool> release_it{false};
  auto slow = [](void*, size_t, void*) {
    inside = 1;
    while (!release_it.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    calls++;
    inside = 0;
  };
  ASSERT_EQ(rdmalloc_on_release(slow, nullptr), RDMALLOC_OK);
  void* p = MallocUsed(kBig, 4);
  free(p);
  ForceDecay();
  for (int i = 0; i < 500 && inside.load() == 0; i++)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  ASSERT_EQ(inside.load(), 1) << "callback did not start";
  std::thread releaser([] {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    release_it = true;
  });
  ASSERT_EQ(rdmalloc_on_release_remove(slow, nullptr), RDMALLOC_OK);
  EXPECT_EQ(inside.load(), 0) << "remove returned while the callback ran";
  EXPECT_EQ(calls.load(), 1);
  releaser.join();

  static std::atomic<int> self_calls{0};
  auto once = [](void*, size_t, void* arg) {
    self_calls++;
    rdmalloc_on_release_remove(reinterpret_cast<rdmalloc_release_fn>(arg), arg);
  };
  // The callback is its own argument so that it can name itself.
  rdmalloc_release_fn once_fn = once;
  ASSERT_EQ(rdmalloc_on_release(once_fn, reinterpret_cast<void*>(once_fn)), RDMALLOC_OK);
  for (int round = 0; round < 2; round++) {
    void* q = MallocUsed(kBig, 5);
    free(q);
    ForceDecay();
    for (int i = 0; i < 300 && self_calls.load() == 0; i++)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(self_calls.load(), 1) << "a callback that removed itself ran again";
  EXPECT_EQ(Stats().observers, 0u);
}

TEST(OnRelease, ArgumentErrorsAndTableFull) {
  EXPECT_EQ(rdmalloc_on_release(nullptr, nullptr), RDMALLOC_EINVAL);
  EXPECT_EQ(rdmalloc_on_release_remove(nullptr, nullptr), RDMALLOC_EINVAL);
  auto cb = [](void*, size_t, void*) {};
  static int args[9];
  for (int i = 0; i < 8; i++) ASSERT_EQ(rdmalloc_on_release(cb, &args[i]), RDMALLOC_OK) << i;
  errno = 0;
  EXPECT_EQ(rdmalloc_on_release(cb, &args[8]), RDMALLOC_EINVAL);
  EXPECT_EQ(errno, ENOSPC);
  for (int i = 0; i < 8; i++) EXPECT_EQ(rdmalloc_on_release_remove(cb, &args[i]), RDMALLOC_OK);
}

// A fork child has no release thread at first; its observers still hear of
// its releases (through the next rdmalloc_* call, which restarts the thread).
TEST(OnRelease, ForkChildIsNotifiedToo) {
  static std::atomic<int> calls{0};
  auto cb = [](void*, size_t, void*) { calls++; };
  ASSERT_EQ(rdmalloc_on_release(cb, nullptr), RDMALLOC_OK);
  pid_t pid = fork();
  if (pid == 0) {
    calls = 0;
    void* p = MallocUsed(kBig, 6);
    free(p);
    ForceDecay();
    struct rdmalloc_stats s;
    rdmalloc_stats(&s, sizeof s);  // an rdmalloc_* call: drains, restarts the thread
    for (int i = 0; i < 300 && calls.load() == 0; i++) usleep(10000);
    _exit(calls.load() >= 1 ? 0 : 1);
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "child observer not notified";
  ASSERT_EQ(rdmalloc_on_release_remove(cb, nullptr), RDMALLOC_OK);
}

}  // namespace
