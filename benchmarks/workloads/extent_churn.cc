// extent_churn: every allocation and free reaches the allocator's page level.
// One op = one malloc or one free.
//
// Usage: extent_churn [threads=1] [scale=1.0]
// Each thread keeps kLive blocks of 64 KiB .. 1 MiB (large size classes, past
// jemalloc's thread cache) and replaces the oldest one per step, writing the
// first and last byte and checking them before the free. Run it with
// MALLOC_CONF=dirty_decay_ms:0,muzzy_decay_ms:0 (benchmarks/run.py does): then
// jemalloc hands every freed extent back at once and asks for a new one on
// every allocation, so under rdmalloc every op goes through the extent hooks
// into the region store: the path where threads of different arenas would
// contend on a lock of rdmalloc's. Under rdmalloc the result line also gives
// heap_lock_waits (rdmalloc_stats, found with dlsym): how many of those
// extent requests found their lock held. The total work is fixed,
// kTotalSteps * scale steps, split evenly among the threads.
#include <dlfcn.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "allocator/rdmalloc.h"
#include "benchmarks/workloads/workload.h"

namespace {

constexpr char kName[] = "extent_churn";
constexpr size_t kMinSize = 64 << 10;
constexpr size_t kMaxSize = 1 << 20;
constexpr size_t kLive = 8;
constexpr double kTotalSteps = 400000;

struct Block {
  unsigned char* p = nullptr;
  size_t n = 0;
  unsigned char tag = 0;
};

using StatsFn = int (*)(struct rdmalloc_stats*, size_t);

uint64_t LockWaits(StatsFn stats) {
  struct rdmalloc_stats s = {};
  if (stats == nullptr || stats(&s, sizeof s) != 0 ||
      s.size < offsetof(struct rdmalloc_stats, heap_lock_waits) + sizeof s.heap_lock_waits)
    return 0;
  return s.heap_lock_waits;
}

}  // namespace

int main(int argc, char** argv) {
  workload::Args args = workload::ParseArgs(argc, argv);
  long steps = workload::Share(kTotalSteps, args);
  std::vector<uint64_t> ops(args.threads), bad(args.threads);
  auto stats = reinterpret_cast<StatsFn>(dlsym(RTLD_DEFAULT, "rdmalloc_stats"));
  uint64_t waits_before = LockWaits(stats);
  int rc = workload::Run(
      kName, args.threads, workload::OneThread::kMainThread,
      [&](int t) {
        workload::Rng rng(t + 1);
        Block live[kLive];
        uint64_t n_ops = 0, n_bad = 0;
        for (long s = 0; s < steps; s++) {
          Block& b = live[s % kLive];
          if (b.p != nullptr) {
            n_bad += b.p[0] != b.tag || b.p[b.n - 1] != static_cast<unsigned char>(~b.tag);
            free(b.p);
            n_ops++;
          }
          b.n = kMinSize + rng.Next() % (kMaxSize - kMinSize);
          b.p = static_cast<unsigned char*>(workload::Malloc(kName, b.n));
          b.tag = static_cast<unsigned char>(rng.Next());
          b.p[0] = b.tag;
          b.p[b.n - 1] = static_cast<unsigned char>(~b.tag);
          n_ops++;
        }
        for (Block& b : live) {
          if (b.p != nullptr) free(b.p);
        }
        ops[t] = n_ops;
        bad[t] = n_bad;
      },
      [&]() -> workload::Ops {
        uint64_t total = 0, wrong = 0;
        for (int t = 0; t < args.threads; t++) {
          total += ops[t];
          wrong += bad[t];
        }
        if (wrong != 0) {
          fprintf(stderr, "%s: %llu blocks lost their bytes\n", kName, (unsigned long long)wrong);
          return std::nullopt;
        }
        return total;
      });
  if (rc == 0 && stats != nullptr)
    printf("heap_lock_waits=%llu\n", (unsigned long long)(LockWaits(stats) - waits_before));
  return rc;
}
