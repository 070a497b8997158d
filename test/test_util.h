// Helpers shared by rdmalloc's in-process tests (linked with //allocator:core,
// so the test binary's own malloc is rdmalloc).
#ifndef RDMALLOC_TEST_TEST_UTIL_H_
#define RDMALLOC_TEST_TEST_UTIL_H_

#include <jemalloc/jemalloc.h>

#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <time.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

extern char** environ;

#include "allocator/rdmalloc.h"
#include "test/address_only.h"
#include "test/pattern.h"
#include "test/proc_status.h"

namespace rdmalloc_test {

// Pinned memory of this process (kB).
inline long VmPinKb() { return StatusKb("VmPin"); }

inline struct rdmalloc_stats Stats() {
  struct rdmalloc_stats s;
  memset(&s, 0, sizeof s);
  rdmalloc_stats(&s, sizeof s);
  return s;
}

// Polls `done` every millisecond for up to 10 s; returns whether it held.
template <typename Done>
bool WaitUntil(Done done) {
  for (int i = 0; i < 10000; i++) {
    if (done()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return false;
}

// Waits (up to 10 s) until the release thread has finished every release
// queued so far: rdmalloc_* calls never wait for it. Returns whether it did.
inline bool WaitForReleases() {
  return WaitUntil([] { return Stats().releases_pending == 0; });
}

// Makes jemalloc give back everything it caches: this thread's tcache, then
// every arena's dirty and muzzy extents (through rdmalloc's dalloc hook), and
// waits for the releases that follow.
inline void ForceDecay() {
  mallctl("thread.tcache.flush", nullptr, nullptr, nullptr, 0);
  mallctl("arena.4096.purge", nullptr, nullptr, nullptr, 0);  // MALLCTL_ARENAS_ALL
  WaitForReleases();
}

// A byte pattern that differs per (seed, offset), so a stale page never
// passes for a fresh one.
inline uint8_t PatternByte(uint64_t seed, size_t i) {
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + i;
  x ^= x >> 29;
  x *= 0xBF58476D1CE4E5B9ull;
  return static_cast<uint8_t>(x >> 32);
}

inline void FillPattern(void* p, size_t n, uint64_t seed) {
  auto* b = static_cast<uint8_t*>(p);
  for (size_t i = 0; i < n; i++) b[i] = PatternByte(seed, i);
}

inline bool HasPattern(const void* p, size_t n, uint64_t seed) {
  auto* b = static_cast<const uint8_t*>(p);
  for (size_t i = 0; i < n; i++)
    if (b[i] != PatternByte(seed, i)) return false;
  return true;
}

// io_uring may drop its pins a moment after the unregister returns (the
// kernel frees them when the last reference goes): poll briefly.
inline long VmPinKbWhen(bool (*ok)(long kb, long want), long want) {
  long kb = VmPinKb();
  for (int i = 0; i < 200 && !ok(kb, want); i++) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    kb = VmPinKb();
  }
  return kb;
}

// Runs this test binary again with `extra_env` added, only `test_name`, and
// TEST_RERUN_CHILD=1 set; returns its exit status (-1 if it did not exit).
// For settings that rdmalloc reads once at start-up.
inline int RerunSelf(const std::string& test_name, std::vector<std::string> extra_env) {
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; e++) {
    // The child must not overwrite the parent's test report.
    if (strncmp(*e, "GTEST_OUTPUT=", 13) != 0 && strncmp(*e, "XML_OUTPUT_FILE=", 16) != 0)
      env.push_back(*e);
  }
  for (auto& e : extra_env) env.push_back(e);
  env.push_back("TEST_RERUN_CHILD=1");
  std::vector<char*> envp;
  for (auto& e : env) envp.push_back(e.data());
  envp.push_back(nullptr);
  std::string filter = "--gtest_filter=" + test_name;
  char* argv[] = {const_cast<char*>("/proc/self/exe"), filter.data(), nullptr};
  pid_t pid;
  if (posix_spawn(&pid, "/proc/self/exe", nullptr, nullptr, argv, envp.data()) != 0) return -1;
  int status = 0;
  if (waitpid(pid, &status, 0) != pid || !WIFEXITED(status)) return -1;
  return WEXITSTATUS(status);
}

inline bool IsRerunChild() { return getenv("TEST_RERUN_CHILD") != nullptr; }

}  // namespace rdmalloc_test

#endif  // RDMALLOC_TEST_TEST_UTIL_H_
