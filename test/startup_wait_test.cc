// Threads that call rdmalloc while another thread is starting it sleep until
// the start is done: they take no CPU from it. The library with rdmalloc
// inside (test/slow_start.cc) is loaded late (dlopen, as a plugin or an MPI
// library that embeds rdmalloc is), so its start comes with the threads'
// first calls, not before main; its backend opens slowly (SLOW_START_MS), and
// eager registration opens it during the start.
//
// usage: startup_wait_test LIBRARY (BUILD sets the environment).
#include <dlfcn.h>
#include <gtest/gtest.h>
#include <time.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <thread>
#include <vector>

namespace {

const char* g_library = nullptr;
constexpr int kThreads = 6;
constexpr int64_t kMs = 1000 * 1000;

int64_t ClockNs(clockid_t clock) {
  timespec ts;
  clock_gettime(clock, &ts);
  return ts.tv_sec * 1000 * kMs + ts.tv_nsec;
}

TEST(StartupWait, CallersSleepWhileAnotherThreadStarts) {
  const char* delay = getenv("SLOW_START_MS");
  ASSERT_NE(delay, nullptr) << "BUILD sets SLOW_START_MS";
  const int64_t delay_ns = atoi(delay) * kMs;

  int64_t loading = ClockNs(CLOCK_MONOTONIC);
  void* lib = dlopen(g_library, RTLD_NOW | RTLD_LOCAL);
  ASSERT_NE(lib, nullptr) << dlerror();
  ASSERT_LT(ClockNs(CLOCK_MONOTONIC) - loading, delay_ns / 2)
      << "rdmalloc started while it was loaded: no start for the threads to wait for";
  // The library's own malloc and free (jemalloc's, with rdmalloc's start).
  auto rd_malloc = reinterpret_cast<void* (*)(size_t)>(dlsym(lib, "malloc"));
  auto rd_free = reinterpret_cast<void (*)(void*)>(dlsym(lib, "free"));
  ASSERT_NE(rd_malloc, nullptr);
  ASSERT_NE(rd_free, nullptr);

  struct Call {
    int64_t cpu_ns = 0, wall_ns = 0;
    bool ok = false;
  };
  std::vector<Call> calls(kThreads);
  std::atomic<int> ready{0};
  std::atomic<bool> go{false};
  std::vector<std::thread> threads;
  for (int i = 0; i < kThreads; i++) {
    threads.emplace_back([&, i] {
      ready++;
      while (!go.load()) std::this_thread::yield();
      int64_t cpu = ClockNs(CLOCK_THREAD_CPUTIME_ID), wall = ClockNs(CLOCK_MONOTONIC);
      void* p = rd_malloc(100);
      calls[i] = {ClockNs(CLOCK_THREAD_CPUTIME_ID) - cpu, ClockNs(CLOCK_MONOTONIC) - wall,
                  p != nullptr};
      rd_free(p);
    });
  }
  while (ready.load() < kThreads) std::this_thread::yield();
  go = true;
  for (std::thread& t : threads) t.join();

  // One thread started rdmalloc (it slept in the domain's open); the others
  // called while it did and returned only after it: each call's wall time
  // holds the open. Their CPU time is each thread's first call (its arena,
  // its cache: a few ms), and whatever the waiting took: threads that yield
  // instead of sleeping keep both cores busy for the whole open.
  int64_t cpu_ns = 0;
  int waited = 0;
  for (const Call& c : calls) {
    EXPECT_TRUE(c.ok);
    cpu_ns += c.cpu_ns;
    if (c.wall_ns >= delay_ns * 3 / 4) waited++;
  }
  printf("%d of %d first calls waited for the start (%.0f ms open); their CPU time: %.1f ms\n",
         waited, kThreads, delay_ns / 1e6, cpu_ns / 1e6);
  EXPECT_GE(waited, kThreads - 1) << "the calls did not meet the start under way";
  EXPECT_LT(cpu_ns, delay_ns / 2) << "threads that wait for the start take the CPU it needs";
  // Started once: every later call takes the fast path.
  int64_t cpu = ClockNs(CLOCK_THREAD_CPUTIME_ID);
  rd_free(rd_malloc(100));
  EXPECT_LT(ClockNs(CLOCK_THREAD_CPUTIME_ID) - cpu, 20 * kMs);
}

}  // namespace

int main(int argc, char** argv) {
  testing::InitGoogleTest(&argc, argv);
  if (argc != 2) {
    fprintf(stderr, "usage: startup_wait_test LIBRARY\n");
    return 2;
  }
  g_library = argv[1];
  return RUN_ALL_TESTS();
}
