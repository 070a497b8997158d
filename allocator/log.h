// RDMALLOC_VERBOSE logging and the clock: base services every room uses.
// Log builds its line on the stack and writes it with write(2), so it is safe
// in hook context and never allocates.
#ifndef RDMALLOC_ALLOCATOR_LOG_H_
#define RDMALLOC_ALLOCATOR_LOG_H_

#include <cstdint>

namespace rdmalloc {

void SetLogLevel(int verbose);
// One line on stderr if RDMALLOC_VERBOSE >= level (0: always).
void Log(int level, const char* format, ...) __attribute__((format(printf, 2, 3)));

// CLOCK_MONOTONIC in ns, through the vDSO: no system call.
uint64_t NowNs();

}  // namespace rdmalloc

#endif  // RDMALLOC_ALLOCATOR_LOG_H_
