// Helpers shared by the release-notification tests.
#ifndef RDMALLOC_INTEGRATIONS_NOTIFY_TEST_UTIL_H_
#define RDMALLOC_INTEGRATIONS_NOTIFY_TEST_UTIL_H_

#include <chrono>
#include <cstdint>
#include <thread>

#include "test/test_util.h"

namespace rdmalloc_test {

// Buffers from an arena of their own, bypassing the thread cache: nothing
// else the test (or gtest) allocates can land in their regions, so a freed
// buffer's region is empty after ForceDecay exactly when the test says so.
// Page-aligned: no cache-oblivious offset, a buffer starts where its extent does.
class PrivateArena {
 public:
  PrivateArena() {
    size_t len = sizeof index_;
    created_ = mallctl("arenas.create", &index_, &len, nullptr, 0) == 0;
  }
  bool ok() const { return created_; }
  void* Alloc(size_t size) const {
    return mallocx(size, MALLOCX_ARENA(index_) | MALLOCX_TCACHE_NONE | MALLOCX_ALIGN(4096));
  }

 private:
  unsigned index_ = 0;
  bool created_ = false;
};

struct Span {
  uintptr_t begin = 0;
  size_t len = 0;
  bool operator==(const Span& o) const { return begin == o.begin && len == o.len; }
  bool Contains(const void* p) const {
    auto a = reinterpret_cast<uintptr_t>(p);
    return a >= begin && a - begin < len;
  }
};

// The rdmalloc region that holds p (len 0 if p is not rdmalloc heap).
inline Span RegionSpan(const void* p) {
  rdmalloc_keys k;
  if (rdmalloc_lookup(p, 1, nullptr, &k) != RDMALLOC_OK) return {};
  return {reinterpret_cast<uintptr_t>(k.region_base), k.region_len};
}

// Releases and their notifications run on rdmalloc's release thread or inside
// an rdmalloc_* call: drain through rdmalloc_stats and poll until done()
// holds, for at most about ten seconds. Returns done()'s last value.
template <class Done>
bool Eventually(Done done) {
  for (int i = 0; i < 1000; i++) {
    Stats();
    if (done()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return done();
}

}  // namespace rdmalloc_test

#endif  // RDMALLOC_INTEGRATIONS_NOTIFY_TEST_UTIL_H_
