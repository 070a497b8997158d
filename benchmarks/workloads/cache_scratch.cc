// cache_scratch: allocator-induced false sharing. One op = one iteration: malloc one small object, write it kWrites times, check it, free it.
//
// Usage: cache_scratch [threads=1] [scale=1.0]
// The main thread allocates one kObjSize-byte object per thread (so they are
// likely neighbours in memory) and hands object i to thread i. Thread i frees
// it, then repeats: malloc(kObjSize), initialise it, increment every byte
// kWrites times, check the bytes, free it. An allocator that gives the freed
// neighbour back to the thread (or otherwise hands neighbouring objects to
// different threads) makes the threads write to one cache line: false sharing.
// The total work is fixed, kTotalIterations * scale iterations, split evenly
// among the threads. The check: every byte must read back as its initial
// value + kWrites (mod 256), and a checksum of all bytes read must match.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "benchmarks/workloads/workload.h"

namespace {

constexpr char kName[] = "cache_scratch";
constexpr size_t kObjSize = 8;
constexpr int kWrites = 1000;
constexpr double kTotalIterations = 1e6;

struct Tally {
  uint64_t ops = 0, sum = 0, expect = 0, bad = 0;
};

void Worker(int id, char* handed, long iterations, Tally& tally) {
  workload::Rng rng(3000 + id);
  Tally t;
  if (handed[0] != static_cast<char>(id) || handed[kObjSize - 1] != static_cast<char>(id)) t.bad++;
  free(handed);
  for (long it = 0; it < iterations; it++) {
    volatile unsigned char* p = static_cast<volatile unsigned char*>(malloc(kObjSize));
    if (p == nullptr) {
      fprintf(stderr, "cache_scratch: malloc failed\n");
      exit(1);
    }
    unsigned char seed = static_cast<unsigned char>(rng.Next());
    for (size_t k = 0; k < kObjSize; k++) p[k] = static_cast<unsigned char>(seed + k);
    for (int w = 0; w < kWrites; w++)
      for (size_t k = 0; k < kObjSize; k++) p[k] = static_cast<unsigned char>(p[k] + 1);
    for (size_t k = 0; k < kObjSize; k++) {
      unsigned char want = static_cast<unsigned char>(seed + k + kWrites);
      unsigned char got = p[k];
      if (got != want) t.bad++;
      t.sum += got;
      t.expect += want;
    }
    free(const_cast<unsigned char*>(p));
    t.ops++;
  }
  tally = t;
}

}  // namespace

int main(int argc, char** argv) {
  const workload::Args args = workload::ParseArgs(argc, argv);
  const int threads = args.threads;
  const long iterations = workload::Share(kTotalIterations, args);
  std::vector<Tally> tallies(threads);

  return workload::Measure(
      kName, threads,
      [&] {
        // Allocated back to back by one thread: neighbours, as in the original test.
        std::vector<char*> handed(threads);
        for (int i = 0; i < threads; i++) {
          handed[i] = static_cast<char*>(malloc(kObjSize));
          if (handed[i] == nullptr) exit(1);
          handed[i][0] = static_cast<char>(i);
          handed[i][kObjSize - 1] = static_cast<char>(i);
        }
        workload::RunThreads(threads, workload::OneThread::kNewThread,
                             [&](int i) { Worker(i, handed[i], iterations, tallies[i]); });
      },
      [&]() -> workload::Ops {
        uint64_t ops = 0, sum = 0, expect = 0, bad = 0;
        for (const Tally& t : tallies) {
          ops += t.ops;
          sum += t.sum;
          expect += t.expect;
          bad += t.bad;
        }
        if (bad != 0 || sum != expect || ops != static_cast<uint64_t>(iterations) * threads) {
          fprintf(stderr, "cache_scratch: verification failed: bad=%llu checksum %llu vs %llu ops=%llu\n",
                  (unsigned long long)bad, (unsigned long long)sum, (unsigned long long)expect,
                  (unsigned long long)ops);
          return std::nullopt;
        }
        return ops;
      });
}
