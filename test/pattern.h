// Byte patterns and a clock for tests, with nothing of rdmalloc's: also for
// plain verbs programs that must not include rdmalloc.h.
#ifndef RDMALLOC_TEST_PATTERN_H_
#define RDMALLOC_TEST_PATTERN_H_

#include <time.h>

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace rdmalloc_test {

inline double NowSeconds() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec / 1e9;
}

// A fast position-dependent pattern, one mix per 8 bytes: under the VM's
// emulated CPU the per-byte pattern above is too slow for 64 MiB buffers.
inline uint64_t PatternWord(uint64_t seed, uint64_t i) {
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + i * 0xD1B54A32D192ED03ull + 1;
  x ^= x >> 31;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 29;
  return x;
}

// Writes bytes [off, off+n) of the word pattern to p[0, n); off % 8 == 0.
inline void FillWords(void* p, size_t off, size_t n, uint64_t seed) {
  auto* b = static_cast<uint8_t*>(p);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t w = PatternWord(seed, (off + i) / 8);
    memcpy(b + i, &w, 8);
  }
  if (i < n) {
    uint64_t w = PatternWord(seed, (off + i) / 8);
    memcpy(b + i, &w, n - i);
  }
}

// How many bytes of p[0, n) differ from bytes [off, off+n) of the pattern.
inline size_t WordMismatches(const void* p, size_t off, size_t n, uint64_t seed) {
  auto* b = static_cast<const uint8_t*>(p);
  size_t bad = 0, i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t got, want = PatternWord(seed, (off + i) / 8);
    memcpy(&got, b + i, 8);
    if (got != want)
      for (int j = 0; j < 8; j++) bad += ((got >> (8 * j)) & 0xff) != ((want >> (8 * j)) & 0xff);
  }
  if (i < n) {
    uint64_t want = PatternWord(seed, (off + i) / 8);
    auto* w = reinterpret_cast<const uint8_t*>(&want);
    for (size_t j = 0; i + j < n; j++) bad += b[i + j] != w[j];
  }
  return bad;
}

}  // namespace rdmalloc_test

#endif  // RDMALLOC_TEST_PATTERN_H_
