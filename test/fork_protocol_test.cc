// The fork protocol (allocator/fork.h): one handler takes every lock, rdmalloc's
// and jemalloc's, in the one lock order. Also here, since this process runs
// with jemalloc's background threads: every block still comes from the heap. Two programs that used to hang in
// fork: jemalloc's background threads decaying into rdmalloc's hooks, and a
// thread making and destroying arenas. The process runs with background
// threads and fast decay (BUILD: MALLOC_CONF); a hang ends at the alarm with
// the number of the fork that hung.
#include <jemalloc/jemalloc.h>
#include <pthread.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "allocator/jemalloc_api.h"
#include "allocator/rdmalloc.h"
#include "test/test_util.h"

namespace {

std::atomic<int> g_fork_number{-1};

void OnAlarm(int) {
  char line[128];
  int n = snprintf(line, sizeof line, "HANG: fork number %d did not return within the deadline\n",
                   g_fork_number.load());
  ssize_t ignored = write(STDERR_FILENO, line, static_cast<size_t>(n));
  (void)ignored;
  _exit(3);
}

// Forks `forks` children that allocate and exit while `churn` runs on other
// threads; every child must exit 0. Returns the number of forks done.
template <typename Churn>
int ForkWhile(int forks, int threads, Churn churn) {
  signal(SIGALRM, OnAlarm);
  alarm(120);
  std::atomic<bool> stop{false};
  std::vector<std::thread> workers;
  for (int t = 0; t < threads; t++) workers.emplace_back([&, t] { churn(t, stop); });
  int done = 0;
  for (int f = 0; f < forks; f++) {
    g_fork_number = f;
    pid_t pid = fork();
    if (pid == 0) {
      // The child's heap works, also from a new thread.
      void* p = malloc(1000);
      void* q = malloc(size_t{1} << 20);
      memset(q, 1, size_t{1} << 20);
      std::thread t([] { free(malloc(5000)); });
      t.join();
      free(p);
      free(q);
      _exit(0);
    }
    int status = 0;
    EXPECT_EQ(waitpid(pid, &status, 0), pid);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "child of fork " << f;
    done++;
  }
  stop = true;
  for (std::thread& w : workers) w.join();
  alarm(0);
  return done;
}

// jemalloc starts its first background thread while it initialises, before
// rdmalloc's hooks exist; the thread's TLS then came from a slab outside the
// heap, and so did most later blocks of that size class (320 bytes here).
TEST(BackgroundThreads, EveryBlockOfEverySmallClassLiesInTheHeap) {
  for (size_t size = 8; size <= 16384; size += size < 512 ? 8 : 256) {
    std::vector<void*> blocks;
    int not_ours = 0;
    for (int i = 0; i < 64; i++) {
      void* p = malloc(size);
      ASSERT_NE(p, nullptr);
      rdmalloc_keys k;
      not_ours += rdmalloc_lookup(p, size, nullptr, &k) != RDMALLOC_OK;
      blocks.push_back(p);
    }
    EXPECT_EQ(not_ours, 0) << "of 64 blocks of " << size << " bytes";
    for (void* p : blocks) free(p);
  }
}

// Every thread is on jemalloc's slow paths while rdmalloc is not ready, so
// that only they check for its start (third_party/jemalloc_rdmalloc.patch,
// tsd_global_slow). Once it is ready every thread must be fast again, or
// every malloc of the process would take the slow path; a fork child is
// slow until its first allocation restarts it, then fast.
TEST(StartUp, ThreadsAreFastOnceReadyAndAForkChildOnceRestarted) {
  // Through a volatile pointer: the compiler drops a malloc whose block is
  // only freed.
  auto allocate = [] {
    void* volatile p = malloc(100);
    free(p);
  };
  allocate();
  EXPECT_TRUE(rdmj_thread_fast()) << "the main thread, rdmalloc started";
  bool fast = false;
  std::thread([&] {
    allocate();
    fast = rdmj_thread_fast();
  }).join();
  EXPECT_TRUE(fast) << "a new thread after its first malloc";
  pid_t pid = fork();
  if (pid == 0) {
    if (rdmj_thread_fast()) _exit(1);
    allocate();
    _exit(rdmj_thread_fast() ? 0 : 2);
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "1: the child was fast before its restart, 2: slow after it";
}

TEST(ForkProtocol, BackgroundThreadsRunningInsideTheHooks) {
  bool background = false;
  size_t len = sizeof background;
  ASSERT_EQ(mallctl("background_thread", &background, &len, nullptr, 0), 0);
  ASSERT_TRUE(background) << "this test needs MALLOC_CONF=background_thread:true (see BUILD)";
  int done = ForkWhile(300, 2, [](int t, std::atomic<bool>& stop) {
    std::mt19937 rng(t + 1);
    void* keep[64] = {};
    size_t sizes[64] = {};
    while (!stop.load()) {
      int i = static_cast<int>(rng() % 64);
      if (keep[i] != nullptr) {
        ASSERT_EQ(static_cast<unsigned char*>(keep[i])[sizes[i] - 1], (i & 0x7f) + 1);
        free(keep[i]);
      }
      sizes[i] = rng() % 4 ? 1 + rng() % 512 : (size_t{64} << 10) + rng() % (size_t{4} << 20);
      keep[i] = malloc(sizes[i]);
      memset(keep[i], (i & 0x7f) + 1, sizes[i]);
    }
    for (void* p : keep) free(p);
  });
  EXPECT_EQ(done, 300);
}

TEST(ForkProtocol, ArenasMadeAndDestroyedDuringFork) {
  int done = ForkWhile(200, 1, [](int, std::atomic<bool>& stop) {
    while (!stop.load()) {
      unsigned ind = 0;
      size_t len = sizeof ind;
      ASSERT_EQ(mallctl("arenas.create", &ind, &len, nullptr, 0), 0);
      void* p = mallocx(100000, MALLOCX_ARENA(ind) | MALLOCX_TCACHE_NONE);
      ASSERT_NE(p, nullptr);
      memset(p, 3, 100000);
      dallocx(p, MALLOCX_TCACHE_NONE);
      char name[64];
      snprintf(name, sizeof name, "arena.%u.destroy", ind);
      ASSERT_EQ(mallctl(name, nullptr, nullptr, nullptr, 0), 0);
    }
  });
  EXPECT_EQ(done, 200);
}

// Lookups register regions (reg_lock, then the backend) and class arenas are
// made while other threads fork: the child registers anew, the parent's keys
// still work.
TEST(ForkProtocol, RegistrationsAndClassArenasDuringFork) {
  int done = ForkWhile(100, 2, [](int t, std::atomic<bool>& stop) {
    std::mt19937 rng(t + 7);
    while (!stop.load()) {
      size_t n = (size_t{1} << 20) + rng() % (size_t{8} << 20);
      void* p = t == 0 ? malloc(n) : rdmalloc_alloc(n, RDMALLOC_REMOTE_READ);
      ASSERT_NE(p, nullptr);
      memset(p, 5, 4096);
      rdmalloc_keys k;
      ASSERT_EQ(rdmalloc_lookup(p, 4096, nullptr, &k), RDMALLOC_OK);
      free(p);
      if (rng() % 8 == 0) mallctl("arena.4096.purge", nullptr, nullptr, nullptr, 0);
    }
  });
  EXPECT_EQ(done, 100);
}

// jemalloc adds a node to its extent map (a leaf per GiB of address space)
// under a lock jemalloc_prefork leaves out, allocating the node through
// rdmalloc's hooks meanwhile. 3 GiB of address space, never touched, reach
// into a GiB the map has not seen.
void* BlockInANewGiB() { return malloc(size_t{3} << 30); }

pthread_mutex_t* ExtentMapLock() { return &je_arena_emap_global.init_lock.lock; }

// jemalloc_api.h's picture of jemalloc's extent map is jemalloc's.
TEST(ExtentMapLock, IsTheLockJemallocTakesToGrowItsExtentMap) {
  ASSERT_EQ(pthread_mutex_lock(ExtentMapLock()), 0);
  std::atomic<bool> made{false};
  void* p = nullptr;
  std::thread t([&] {
    p = BlockInANewGiB();
    made = true;
  });
  usleep(300 * 1000);
  EXPECT_FALSE(made.load()) << "a block in a new GiB was made while the extent map's lock was "
                               "held: jemalloc_api.h's layout is not jemalloc's";
  ASSERT_EQ(pthread_mutex_unlock(ExtentMapLock()), 0);
  t.join();
  ASSERT_NE(p, nullptr);
  free(p);
}

// The lock held at fork (here by the forking thread, in the fork matrix by a
// thread starting up in a fresh process): the child's first block in a new
// GiB waited for it forever before fork.cc re-initialised it in the child.
TEST(ExtentMapLock, AChildForkedWhileTheMapGrewGrowsItToo) {
  ASSERT_EQ(pthread_mutex_lock(ExtentMapLock()), 0);
  pid_t pid = fork();
  if (pid == 0) {
    alarm(20);
    void* p = BlockInANewGiB();
    if (p == nullptr) _exit(2);
    memset(p, 1, 4096);
    free(p);
    _exit(0);
  }
  ASSERT_EQ(pthread_mutex_unlock(ExtentMapLock()), 0);
  ASSERT_GT(pid, 0);
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  EXPECT_FALSE(WIFSIGNALED(status) && WTERMSIG(status) == SIGALRM)
      << "the child hung on the extent map's lock";
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "status " << status;
}

}  // namespace
