// Test helper: the calling thread's CPU time, to tell a waiter that sleeps
// from one that spins.
#ifndef RDMALLOC_ALLOCATOR_THREAD_CPU_H_
#define RDMALLOC_ALLOCATOR_THREAD_CPU_H_

#include <time.h>

#include <cstdint>

namespace rdmalloc {

inline uint64_t ThreadCpuNs() {
  timespec t;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return uint64_t(t.tv_sec) * 1000000000 + uint64_t(t.tv_nsec);
}

}  // namespace rdmalloc

#endif  // RDMALLOC_ALLOCATOR_THREAD_CPU_H_
