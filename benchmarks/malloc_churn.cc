// malloc/free throughput, for comparing allocators under LD_PRELOAD with the
// same binary: each thread keeps a window of live objects of mixed sizes and
// replaces one per step. Prints one line: threads, operations, Mops/s.
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

namespace {

uint64_t Next(uint64_t& s) {
  s ^= s << 13;
  s ^= s >> 7;
  s ^= s << 17;
  return s;
}

size_t Size(uint64_t r) {
  // 90% small (16..1024 B), 9% medium (1..64 KiB), 1% large (64 KiB..1 MiB).
  unsigned bucket = r % 100;
  r >>= 8;
  if (bucket < 90) return 16 + r % 1009;
  if (bucket < 99) return 1024 + r % (63 << 10);
  return (64 << 10) + r % (960 << 10);
}

void Work(int id, long steps, std::vector<void*>& window) {
  uint64_t s = 0x9E3779B97F4A7C15ull * (id + 1);
  for (long i = 0; i < steps; i++) {
    uint64_t r = Next(s);
    size_t slot = r % window.size();
    free(window[slot]);
    size_t n = Size(Next(s));
    auto* p = static_cast<char*>(malloc(n));
    p[0] = static_cast<char>(i);  // touch it, as a program would
    p[n - 1] = 1;
    window[slot] = p;
  }
}

}  // namespace

int main(int argc, char** argv) {
  int threads = argc > 1 ? atoi(argv[1]) : 1;
  long steps = argc > 2 ? atol(argv[2]) : 2000000;
  std::vector<std::vector<void*>> windows(threads, std::vector<void*>(4096, nullptr));
  auto t0 = std::chrono::steady_clock::now();
  std::vector<std::thread> ts;
  for (int i = 0; i < threads; i++) ts.emplace_back(Work, i, steps, std::ref(windows[i]));
  for (auto& t : ts) t.join();
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  for (auto& w : windows)
    for (void* p : w) free(p);
  // One malloc and one free per step.
  printf("threads=%d ops=%ld mops_per_s=%.2f\n", threads, 2 * steps * threads,
         2.0 * steps * threads / secs / 1e6);
  return 0;
}
