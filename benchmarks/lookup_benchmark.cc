// rdmalloc_lookup on the hit path (the region is registered), 1 and 2
// threads, small and large buffers; a random pattern over thousands of live
// buffers in many regions (cache misses in the region map and descriptors,
// as a real message stream has; the `regions` counter says how many: about
// 10 at the default RDMALLOC_REGION_SIZE, 95 at 4M); and a miss.
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
// their own) and a random order to visit them in, given by a precomputed
// index table: the loop's own cost is one load and an add.
struct RandomBuffers {
  static constexpr size_t kBuffers = 8192;
  static constexpr size_t kOrder = 1 << 16;
  std::vector<void*> bufs = std::vector<void*>(kBuffers);
  std::vector<size_t> lens = std::vector<size_t>(kBuffers);
  std::vector<uint32_t> order = std::vector<uint32_t>(kOrder);

  RandomBuffers() {
    std::mt19937_64 rng(42);
    for (size_t i = 0; i < kBuffers; i++) {
      lens[i] = i % 512 == 0 ? (size_t{1} << 20) << (rng() % 4) : size_t{64} << (rng() % 13);
      bufs[i] = malloc(lens[i]);
    }
    for (uint32_t& o : order) o = static_cast<uint32_t>(rng() % kBuffers);
  }
  ~RandomBuffers() {
    for (void* p : bufs) free(p);
  }
  uint32_t Next(size_t& i) const { return order[i++ & (kOrder - 1)]; }
};

// Every buffer registered, then looked up in the random order.
void BM_LookupRandom(benchmark::State& state) {
  RandomBuffers r;
  rdmalloc_keys k;
  for (size_t b = 0; b < RandomBuffers::kBuffers; b++) {
    if (rdmalloc_lookup(r.bufs[b], r.lens[b], nullptr, &k) != RDMALLOC_OK) {
      state.SkipWithError("lookup failed");
      return;
    }
  }
  size_t i = 0;
  for (auto _ : state) {
    uint32_t b = r.Next(i);
    benchmark::DoNotOptimize(rdmalloc_lookup(r.bufs[b], r.lens[b], nullptr, &k));
    benchmark::DoNotOptimize(k.lkey);
  }
  struct rdmalloc_stats stats = {};
  if (rdmalloc_stats(&stats, sizeof stats) == RDMALLOC_OK)
    state.counters["regions"] = static_cast<double>(stats.regions_live);
}
BENCHMARK(BM_LookupRandom)->Threads(1)->Threads(2);

// The same loop without the lookup: each buffer's address and length loaded
// and passed on. What of BM_LookupRandom is the probe itself.
void BM_LookupRandomProbeOnly(benchmark::State& state) {
  RandomBuffers r;
  size_t i = 0;
  for (auto _ : state) {
    uint32_t b = r.Next(i);
    benchmark::DoNotOptimize(r.bufs[b]);
    benchmark::DoNotOptimize(r.lens[b]);
  }
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
