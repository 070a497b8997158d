// rdmalloc_lookup on the hit path (the region is registered), 1 and 2
// threads, small and large buffers; a random pattern over thousands of live
// buffers in many regions (cache misses in the region map and descriptors,
// as a real message stream has); and a miss.
#include <benchmark/benchmark.h>

#include <cstdint>
#include <cstdlib>
#include <random>
#include <vector>

#include "allocator/rdmalloc.h"

namespace {

void BM_LookupHit(benchmark::State& state) {
  size_t size = static_cast<size_t>(state.range(0));
  void* p = malloc(size);
  rdmalloc_keys k;
  if (rdmalloc_lookup(p, size, nullptr, &k) != RDMALLOC_OK) state.SkipWithError("lookup failed");
  for (auto _ : state) {
    benchmark::DoNotOptimize(rdmalloc_lookup(p, size, nullptr, &k));
    benchmark::DoNotOptimize(k.lkey);
  }
  free(p);
}
BENCHMARK(BM_LookupHit)->Arg(64)->Arg(64 << 10)->Arg(8 << 20)->Threads(1)->Threads(2);

// 8192 live buffers of 64 B .. 256 KiB (and a few of 1..8 MiB, in regions of
// their own), all registered, looked up in a random order given by a
// precomputed index table: the loop's own cost is one load and an add.
void BM_LookupRandom(benchmark::State& state) {
  constexpr size_t kBuffers = 8192;
  std::mt19937_64 rng(42);
  std::vector<void*> bufs(kBuffers);
  std::vector<size_t> lens(kBuffers);
  for (size_t i = 0; i < kBuffers; i++) {
    lens[i] = i % 512 == 0 ? (size_t{1} << 20) << (rng() % 4) : size_t{64} << (rng() % 13);
    bufs[i] = malloc(lens[i]);
    rdmalloc_keys k;
    if (rdmalloc_lookup(bufs[i], lens[i], nullptr, &k) != RDMALLOC_OK) {
      state.SkipWithError("lookup failed");
      return;
    }
  }
  constexpr size_t kOrder = 1 << 16;
  std::vector<uint32_t> order(kOrder);
  for (uint32_t& o : order) o = static_cast<uint32_t>(rng() % kBuffers);
  size_t i = 0;
  rdmalloc_keys k;
  for (auto _ : state) {
    uint32_t b = order[i++ & (kOrder - 1)];
    benchmark::DoNotOptimize(rdmalloc_lookup(bufs[b], lens[b], nullptr, &k));
    benchmark::DoNotOptimize(k.lkey);
  }
  for (void* p : bufs) free(p);
}
BENCHMARK(BM_LookupRandom)->Threads(1)->Threads(2);

// The same loop over the index table, touching each buffer's first byte
// instead of looking it up: what of BM_LookupRandom is the probe itself.
void BM_LookupRandomProbeOnly(benchmark::State& state) {
  constexpr size_t kBuffers = 8192;
  std::mt19937_64 rng(42);
  std::vector<unsigned char*> bufs(kBuffers);
  for (size_t i = 0; i < kBuffers; i++) {
    size_t len = i % 512 == 0 ? (size_t{1} << 20) << (rng() % 4) : size_t{64} << (rng() % 13);
    bufs[i] = static_cast<unsigned char*>(calloc(1, len));
  }
  constexpr size_t kOrder = 1 << 16;
  std::vector<uint32_t> order(kOrder);
  for (uint32_t& o : order) o = static_cast<uint32_t>(rng() % kBuffers);
  size_t i = 0;
  for (auto _ : state) benchmark::DoNotOptimize(*bufs[order[i++ & (kOrder - 1)]]);
  for (unsigned char* p : bufs) free(p);
}
BENCHMARK(BM_LookupRandomProbeOnly);

void BM_LookupMissNotOurs(benchmark::State& state) {
  int on_stack = 0;
  rdmalloc_keys k;
  for (auto _ : state) benchmark::DoNotOptimize(rdmalloc_lookup(&on_stack, 4, nullptr, &k));
}
BENCHMARK(BM_LookupMissNotOurs);

}  // namespace

BENCHMARK_MAIN();
