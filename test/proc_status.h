// A field of /proc/self/status in kB (VmPin, VmLck, VmRSS, ...), or -1: how
// the tests see what the kernel pinned or locked for this process.
#ifndef RDMALLOC_TEST_PROC_STATUS_H_
#define RDMALLOC_TEST_PROC_STATUS_H_

#include <cstdio>
#include <cstring>

namespace rdmalloc_test {

inline long StatusKb(const char* field) {
  FILE* f = fopen("/proc/self/status", "r");
  if (f == nullptr) return -1;
  char line[256];
  long kb = -1;
  size_t n = strlen(field);
  while (fgets(line, sizeof line, f) != nullptr) {
    if (strncmp(line, field, n) == 0 && line[n] == ':' && sscanf(line + n + 1, "%ld", &kb) == 1) break;
  }
  fclose(f);
  return kb;
}

}  // namespace rdmalloc_test

#endif  // RDMALLOC_TEST_PROC_STATUS_H_
