// The message path: a fresh buffer per message — malloc(n), get keys, touch,
// free — three ways, all pinning through the same io_uring backend:
//   Rdmalloc:     rdmalloc_lookup (the heap is registered already);
//   RegPerMsg:    register and deregister the buffer for every message;
//   UcxRcache:    UCX's registration cache (ucs_rcache, UCM memory events on),
//                 the status quo in MPI libraries today.
// All pin through rdmalloc's backend: io_uring here, ibv_reg_mr where a
// device exists (e.g. rxe0 in the soft-RoCE VM: test/vm/run.sh).
// Plus registration calls per GiB allocated in steady state (from stats).
#include <benchmark/benchmark.h>
#include <sys/mman.h>
#include <ucm/api/ucm.h>
extern "C" {  // rcache.h has no C++ guards of its own
#include <ucs/memory/rcache.h>
}

#include <climits>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>

#include "allocator/rdmalloc.h"
#include "verbs/uring_registrar.h"
#include "verbs/verbs_registrar.h"

namespace {

constexpr uintptr_t kPage = 4096;

// A domain of the same backend as rdmalloc's own (a ring, or a PD of the
// same device) for the two baselines.
rdmalloc::Domain* BaselineDomain() {
  static rdmalloc::Domain* domain = [] {
    int err = 0;
    static std::unique_ptr<rdmalloc::Registrar> registrar;
    if (strcmp(rdmalloc_backend(), "verbs") == 0) {
      static rdmalloc::VerbsApi api;
      if ((err = rdmalloc::LoadVerbsApi(nullptr, &api)) == 0)
        registrar = rdmalloc::MakeVerbsRegistrar(api, getenv("RDMALLOC_DEVICE"));
    } else {
      registrar = rdmalloc::MakeUringRegistrar();
    }
    rdmalloc::Domain* d = registrar ? registrar->OpenDomain(nullptr, 7, &err) : nullptr;
    if (d == nullptr) fprintf(stderr, "cannot open a baseline domain: errno %d\n", err);
    return d;
  }();
  return domain;
}

void Touch(char* p, size_t n) {
  p[0] = 1;
  p[n - 1] = 2;
  benchmark::ClobberMemory();
}

// Registers the regions a size class will use before the clock starts: first
// registrations are a one-time cost, not the message path.
void WarmUp(size_t n) {
  rdmalloc_keys k;
  for (int i = 0; i < 64; i++) {
    char* p = static_cast<char*>(malloc(n));
    rdmalloc_lookup(p, n, nullptr, &k);
    free(p);
  }
}

void BM_FreshBuffer_Rdmalloc(benchmark::State& state) {
  size_t n = static_cast<size_t>(state.range(0));
  WarmUp(n);
  rdmalloc_keys k;
  for (auto _ : state) {
    char* p = static_cast<char*>(malloc(n));
    if (rdmalloc_lookup(p, n, nullptr, &k) != RDMALLOC_OK) state.SkipWithError("lookup failed");
    Touch(p, n);
    benchmark::DoNotOptimize(k.lkey);
    free(p);
  }
}

void BM_FreshBuffer_RegPerMsg(benchmark::State& state) {
  size_t n = static_cast<size_t>(state.range(0));
  rdmalloc::Domain* d = BaselineDomain();
  for (auto _ : state) {
    char* p = static_cast<char*>(malloc(n));
    uintptr_t start = reinterpret_cast<uintptr_t>(p) & ~(kPage - 1);
    size_t len = (reinterpret_cast<uintptr_t>(p) + n - start + kPage - 1) & ~(kPage - 1);
    rdmalloc::Registration reg;
    if (d->Register(reinterpret_cast<void*>(start), len, &reg) != 0) state.SkipWithError("register");
    Touch(p, n);
    d->Deregister(reinterpret_cast<void*>(start), len, reg);
    free(p);
  }
}

struct UcxRegion {
  ucs_rcache_region_t super;
  rdmalloc::Registration reg;
};

ucs_status_t UcxMemReg(void* ctx, ucs_rcache_t*, void*, ucs_rcache_region_t* r, uint16_t) {
  auto* region = reinterpret_cast<UcxRegion*>(r);
  auto* d = static_cast<rdmalloc::Domain*>(ctx);
  void* start = reinterpret_cast<void*>(r->super.start);
  size_t len = r->super.end - r->super.start;
  return d->Register(start, len, &region->reg) == 0 ? UCS_OK : UCS_ERR_IO_ERROR;
}

void UcxMemDereg(void* ctx, ucs_rcache_t*, ucs_rcache_region_t* r) {
  auto* region = reinterpret_cast<UcxRegion*>(r);
  static_cast<rdmalloc::Domain*>(ctx)->Deregister(
      reinterpret_cast<void*>(r->super.start), r->super.end - r->super.start, region->reg);
}

void UcxDump(void*, ucs_rcache_t*, ucs_rcache_region_t*, char* buf, size_t max) {
  snprintf(buf, max, "uring");
}

ucs_rcache_t* UcxCache() {
  static ucs_rcache_t* cache = [] {
    static const ucs_rcache_ops_t ops = {UcxMemReg, UcxMemDereg, UcxDump};
    ucs_rcache_params_t params;
    memset(&params, 0, sizeof params);
    params.region_struct_size = sizeof(UcxRegion);
    params.alignment = kPage;
    params.max_alignment = kPage;
    params.ucm_events = UCM_EVENT_VM_UNMAPPED;  // UCX's memory hooks: as in MPI
    params.ucm_event_priority = 1000;
    params.ops = &ops;
    params.context = BaselineDomain();
    params.max_regions = ULONG_MAX;
    params.max_size = SIZE_MAX;
    params.max_unreleased = SIZE_MAX;
    ucs_rcache_t* c = nullptr;
    if (ucs_rcache_create(&params, "bench", nullptr, &c) != UCS_OK) {
      fprintf(stderr, "ucs_rcache_create failed\n");
      return static_cast<ucs_rcache_t*>(nullptr);
    }
    return c;
  }();
  return cache;
}

void BM_FreshBuffer_UcxRcache(benchmark::State& state) {
  size_t n = static_cast<size_t>(state.range(0));
  ucs_rcache_t* cache = UcxCache();
  if (cache == nullptr) {
    state.SkipWithError("no UCX rcache");
    return;
  }
  for (auto _ : state) {
    char* p = static_cast<char*>(malloc(n));
    ucs_rcache_region_t* region = nullptr;
    if (ucs_rcache_get(cache, p, n, PROT_READ | PROT_WRITE, nullptr, &region) != UCS_OK)
      state.SkipWithError("ucs_rcache_get failed");
    Touch(p, n);
    ucs_rcache_region_put(cache, region);
    free(p);
  }
}

// Keys only, for a buffer that stays allocated: what each cache costs on
// its own, without the allocator's malloc/free that both paths share.
void BM_KeysOnly_Rdmalloc(benchmark::State& state) {
  size_t n = static_cast<size_t>(state.range(0));
  char* p = static_cast<char*>(malloc(n));
  rdmalloc_keys k;
  for (auto _ : state) {
    if (rdmalloc_lookup(p, n, nullptr, &k) != RDMALLOC_OK) state.SkipWithError("lookup failed");
    benchmark::DoNotOptimize(k.lkey);
  }
  free(p);
}

void BM_KeysOnly_UcxRcache(benchmark::State& state) {
  size_t n = static_cast<size_t>(state.range(0));
  ucs_rcache_t* cache = UcxCache();
  if (cache == nullptr) {
    state.SkipWithError("no UCX rcache");
    return;
  }
  char* p = static_cast<char*>(malloc(n));
  for (auto _ : state) {
    ucs_rcache_region_t* region = nullptr;
    if (ucs_rcache_get(cache, p, n, PROT_READ | PROT_WRITE, nullptr, &region) != UCS_OK)
      state.SkipWithError("ucs_rcache_get failed");
    benchmark::DoNotOptimize(region);
    ucs_rcache_region_put(cache, region);
  }
  free(p);
}

// Registered size by size, the three ways side by side, so that no way always
// runs after another's side effects (pinning, unpinning) on the heap.
int RegisterSizes() {
  for (int64_t n : {int64_t{64}, int64_t{1} << 10, int64_t{16} << 10, int64_t{64} << 10,
                    int64_t{256} << 10, int64_t{1} << 20, int64_t{4} << 20}) {
    benchmark::RegisterBenchmark("BM_FreshBuffer_Rdmalloc", BM_FreshBuffer_Rdmalloc)->Arg(n);
    benchmark::RegisterBenchmark("BM_FreshBuffer_UcxRcache", BM_FreshBuffer_UcxRcache)->Arg(n);
    benchmark::RegisterBenchmark("BM_FreshBuffer_RegPerMsg", BM_FreshBuffer_RegPerMsg)->Arg(n);
  }
  for (int64_t n : {int64_t{64}, int64_t{64} << 10, int64_t{4} << 20}) {
    benchmark::RegisterBenchmark("BM_KeysOnly_Rdmalloc", BM_KeysOnly_Rdmalloc)->Arg(n);
    benchmark::RegisterBenchmark("BM_KeysOnly_UcxRcache", BM_KeysOnly_UcxRcache)->Arg(n);
  }
  return 0;
}
const int g_registered = RegisterSizes();

// Steady state: after warm-up, a long churn of fresh buffers with lookups
// should need no registration at all.
void BM_RegistrationsPerGiB(benchmark::State& state) {
  auto churn = [](size_t bytes_total) {
    size_t done = 0;
    uint64_t x = 88172645463325252ull;
    rdmalloc_keys k;
    while (done < bytes_total) {
      x ^= x << 13, x ^= x >> 7, x ^= x << 17;
      size_t n = size_t{64} << (x % 17);  // 64 B .. 4 MiB
      char* p = static_cast<char*>(malloc(n));
      rdmalloc_lookup(p, n, nullptr, &k);
      Touch(p, n);
      free(p);
      done += n;
    }
  };
  churn(size_t{1} << 30);  // warm-up: 1 GiB
  struct rdmalloc_stats before;
  rdmalloc_stats(&before, sizeof before);
  double gib = 0;
  for (auto _ : state) {
    churn(size_t{1} << 30);
    gib += 1;
  }
  struct rdmalloc_stats after;
  rdmalloc_stats(&after, sizeof after);
  state.counters["reg_per_GiB"] = (after.reg_calls - before.reg_calls) / gib;
  state.counters["dereg_per_GiB"] = (after.dereg_calls - before.dereg_calls) / gib;
}
BENCHMARK(BM_RegistrationsPerGiB)->Iterations(4)->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
