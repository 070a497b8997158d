// rdmalloc_lookup on the hit path (the region is registered), 1 and 2
// threads, small and large buffers; and the first lookup of a fresh region.
#include <benchmark/benchmark.h>

#include <cstdlib>

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

void BM_LookupMissNotOurs(benchmark::State& state) {
  int on_stack = 0;
  rdmalloc_keys k;
  for (auto _ : state) benchmark::DoNotOptimize(rdmalloc_lookup(&on_stack, 4, nullptr, &k));
}
BENCHMARK(BM_LookupMissNotOurs);

}  // namespace

BENCHMARK_MAIN();
