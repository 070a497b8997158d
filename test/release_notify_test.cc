// rdmalloc_on_release: observers hear of every range rdmalloc gives back to
// the OS, exactly once, while the addresses are still mapped, never in hook
// context, and never for memory rdmalloc still keeps. No rdmalloc call waits
// for a callback, and no callback runs under an rdmalloc lock: a cache whose
// callback takes its own lock cannot deadlock with lookups made under it.
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

// Polls `done` for up to `ms` milliseconds.
template <typename F>
bool Eventually(F done, int ms = 5000) {
  for (int i = 0; i < ms; i++) {
    if (done()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return done();
}

// Larger than any shared region (RDMALLOC_REGION_SIZE, 64 MiB by default):
// gets a dedicated region, released as a whole when freed and decayed.
constexpr size_t kBig = size_t{72} << 20;

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
  std::atomic<int> goodbyes{0};  // fn(NULL, 0, arg): the last call after removal
};

void Record(void* addr, size_t len, void* arg) {
  auto* seen = static_cast<Seen*>(arg);
  if (addr == nullptr) {
    seen->goodbyes++;
    return;
  }
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
  // seen lives on the stack: the last call must come before it goes.
  ASSERT_TRUE(Eventually([&] { return seen.goodbyes.load() == 1; })) << "no last call";
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
  char* big = rdmalloc_test::AddressOnly(mem);  // its pages' residency after the free
  keep.push_back(malloc(64 << 10));
  memset(big, 3, size_t{8} << 20);
  asm volatile("" : : "r"(big) : "memory");  // the stores must happen
  rdmalloc_keys k;
  // The region is never registered by rdmalloc (no lookup of it): exactly
  // the case where rdmalloc would purge.
  free(mem);
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
  ASSERT_TRUE(Eventually([&] { return seen.goodbyes.load() == 1; })) << "no last call";
}

// Removal never waits for a running callback; the removed observer's last
// call, fn(NULL, 0, arg), comes after that callback returned.
TEST(OnRelease, RemoveNeverWaitsAndTheLastCallComesAfterARunningCallback) {
  static std::atomic<int> inside{0}, calls{0}, goodbye_after_calls{-1};
  static std::atomic<bool> release_it{false};
  auto slow = [](void* addr, size_t, void*) {
    if (addr == nullptr) {
      goodbye_after_calls = calls.load();
      return;
    }
    inside = 1;
    while (!release_it.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    calls++;
    inside = 0;
  };
  ASSERT_EQ(rdmalloc_on_release(slow, nullptr), RDMALLOC_OK);
  void* p = MallocUsed(kBig, 4);
  free(p);
  mallctl("arena.4096.purge", nullptr, nullptr, nullptr, 0);  // not ForceDecay: it would wait
  ASSERT_TRUE(Eventually([] { return inside.load() == 1; })) << "callback did not start";
  ASSERT_EQ(rdmalloc_on_release_remove(slow, nullptr), RDMALLOC_OK);
  EXPECT_EQ(inside.load(), 1) << "remove waited for the running callback";
  EXPECT_EQ(goodbye_after_calls.load(), -1) << "last call while a delivery ran";
  release_it = true;
  ASSERT_TRUE(Eventually([] { return goodbye_after_calls.load() != -1; })) << "no last call";
  EXPECT_EQ(calls.load(), 1);
  EXPECT_EQ(goodbye_after_calls.load(), 1) << "the last call came before the delivery ended";
}

TEST(OnRelease, ACallbackMayRemoveItself) {
  static std::atomic<int> self_calls{0}, goodbyes{0};
  auto once = [](void* addr, size_t, void* arg) {
    if (addr == nullptr) {
      goodbyes++;
      return;
    }
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
  }
  EXPECT_EQ(self_calls.load(), 1) << "a callback that removed itself ran again";
  EXPECT_TRUE(Eventually([] { return goodbyes.load() == 1; })) << "no last call";
  EXPECT_EQ(Stats().observers, 0u);
}

// How UCX's and libfabric's caches are built: the callback takes the cache's
// lock, and other threads call rdmalloc_* while holding it. Each rdmalloc call
// must return while the callback waits for that lock. Run in a child with a
// deadline, so that a deadlock fails the test instead of hanging it.
TEST(OnRelease, NoRdmallocCallWaitsForACallbackThatWaitsForTheCallersLock) {
  pid_t pid = fork();
  if (pid == 0) {
    alarm(20);  // a deadlock ends here, with SIGALRM
    static std::mutex cache_lock;
    static std::atomic<int> waiting{0};
    auto cb = [](void* addr, size_t, void*) {
      if (addr == nullptr) return;
      waiting = 1;
      std::lock_guard<std::mutex> g(cache_lock);
      waiting = 0;
    };
    if (rdmalloc_on_release(cb, nullptr) != RDMALLOC_OK) _exit(10);
    std::unique_lock<std::mutex> held(cache_lock);
    void* p = MallocUsed(kBig, 7);
    free(p);
    mallctl("arena.4096.purge", nullptr, nullptr, nullptr, 0);
    if (!Eventually([] { return waiting.load() == 1; })) _exit(11);
    // The release thread now waits for cache_lock, which this thread holds.
    int token = 0;
    void* fresh = MallocUsed(kBig, 8);  // a new region: the lookup's slow path registers it
    rdmalloc_keys k;
    if (rdmalloc_lookup(fresh, 64, nullptr, &k) != RDMALLOC_OK) _exit(12);
    struct rdmalloc_stats s;
    if (rdmalloc_stats(&s, sizeof s) != RDMALLOC_OK || s.releases_pending == 0) _exit(13);
    if (rdmalloc_add_pd(reinterpret_cast<ibv_pd*>(&token), RDMALLOC_ACCESS_LOCAL_WRITE) !=
        RDMALLOC_OK)
      _exit(14);
    if (rdmalloc_lookup(fresh, 64, reinterpret_cast<ibv_pd*>(&token), &k) != RDMALLOC_OK) _exit(15);
    free(fresh);
    mallctl("arena.4096.purge", nullptr, nullptr, nullptr, 0);  // another release queued
    if (rdmalloc_remove_pd(reinterpret_cast<ibv_pd*>(&token)) != RDMALLOC_OK) _exit(16);
    FILE* devnull = fopen("/dev/null", "w");
    if (rdmalloc_dump_regions(devnull) < 0) _exit(17);
    fclose(devnull);
    if (rdmalloc_on_release_remove(cb, nullptr) != RDMALLOC_OK) _exit(18);
    if (waiting.load() != 1) _exit(19);  // the callback is still blocked: nothing waited for it
    // Its last call cannot have been made yet: the pair may not come back before it.
    errno = 0;
    if (rdmalloc_on_release(cb, nullptr) != RDMALLOC_EINVAL || errno != EBUSY) _exit(21);
    held.unlock();
    if (!Eventually([] { return Stats().releases_pending == 0; })) _exit(20);
    _exit(0);
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_FALSE(WIFSIGNALED(status) && WTERMSIG(status) == SIGALRM)
      << "deadlock: an rdmalloc call waited for a callback blocked on the caller's lock";
  ASSERT_TRUE(WIFEXITED(status)) << "child died with signal " << WTERMSIG(status);
  EXPECT_EQ(WEXITSTATUS(status), 0) << "step that failed: see the _exit codes in the test";
}

// rdmalloc_remove_pd used to run callbacks under its lock: a callback that
// calls rdmalloc_* would deadlock on it.
TEST(OnRelease, CallbacksMayCallRdmallocWhileAPdIsRemoved) {
  pid_t pid = fork();
  if (pid == 0) {
    alarm(20);
    static std::atomic<int> calls{0};
    auto cb = [](void* addr, size_t, void*) {
      if (addr == nullptr) return;
      struct rdmalloc_stats s;
      rdmalloc_stats(&s, sizeof s);
      int token2 = 0;
      rdmalloc_add_pd(reinterpret_cast<ibv_pd*>(&token2), RDMALLOC_ACCESS_LOCAL_WRITE);
      rdmalloc_remove_pd(reinterpret_cast<ibv_pd*>(&token2));
      calls++;
    };
    if (rdmalloc_on_release(cb, nullptr) != RDMALLOC_OK) _exit(10);
    int token = 0;
    if (rdmalloc_add_pd(reinterpret_cast<ibv_pd*>(&token), RDMALLOC_ACCESS_LOCAL_WRITE) !=
        RDMALLOC_OK)
      _exit(11);
    for (int i = 0; i < 4; i++) {
      void* p = MallocUsed(kBig, 9);
      rdmalloc_keys k;
      if (rdmalloc_lookup(p, 64, reinterpret_cast<ibv_pd*>(&token), &k) != RDMALLOC_OK) _exit(12);
      free(p);
      mallctl("arena.4096.purge", nullptr, nullptr, nullptr, 0);
    }
    if (rdmalloc_remove_pd(reinterpret_cast<ibv_pd*>(&token)) != RDMALLOC_OK) _exit(13);
    if (!Eventually([] { return calls.load() >= 4; })) _exit(14);
    _exit(0);
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_FALSE(WIFSIGNALED(status) && WTERMSIG(status) == SIGALRM)
      << "deadlock: a callback calling rdmalloc_* while a pd was removed";
  ASSERT_TRUE(WIFEXITED(status)) << "child died with signal " << WTERMSIG(status);
  EXPECT_EQ(WEXITSTATUS(status), 0) << "step that failed: see the _exit codes in the test";
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
  // Removal frees the slot at once (the last call is owed apart from it).
  EXPECT_EQ(rdmalloc_on_release(cb, &args[8]), RDMALLOC_OK);
  EXPECT_EQ(rdmalloc_on_release_remove(cb, &args[8]), RDMALLOC_OK);
}

// A fork child has no release thread at first; its observers still hear of
// its releases: its first malloc starts the thread again.
TEST(OnRelease, ForkChildIsNotifiedToo) {
  static std::atomic<int> calls{0};
  auto cb = [](void* addr, size_t, void*) { calls += addr != nullptr; };
  ASSERT_EQ(rdmalloc_on_release(cb, nullptr), RDMALLOC_OK);
  pid_t pid = fork();
  if (pid == 0) {
    calls = 0;
    void* p = MallocUsed(kBig, 6);
    free(p);
    mallctl("thread.tcache.flush", nullptr, nullptr, nullptr, 0);
    mallctl("arena.4096.purge", nullptr, nullptr, nullptr, 0);  // no rdmalloc_* call
    for (int i = 0; i < 300 && calls.load() == 0; i++) usleep(10000);
    _exit(calls.load() >= 1 ? 0 : 1);
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "child observer not notified";
  ASSERT_EQ(rdmalloc_on_release_remove(cb, nullptr), RDMALLOC_OK);
}

}  // namespace
