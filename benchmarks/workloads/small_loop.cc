// small_loop: tight malloc/free loop of small objects. One op = one malloc or one free.
//
// Usage: small_loop [threads=1] [scale=1.0]
// Meant to be run with one thread (the default); with T > 1, T threads run the
// same loop independently (no sharing). Each thread keeps a window of kWindow
// live objects; a step frees a random one and puts a new object of random size
// (16..256 B) in its place. The total work is fixed, kTotalSteps * scale
// steps, split evenly among the threads. Every object carries a tag, its size
// and a check byte; each free verifies them, and the sum of tags freed must
// equal the sum made.
#include <cstdint>
#include <cstdio>
#include <vector>

#include "benchmarks/workloads/workload.h"

namespace {

constexpr char kName[] = "small_loop";
constexpr size_t kMinSize = 16;
constexpr size_t kMaxSize = 256;
constexpr size_t kWindow = 64;
constexpr double kTotalSteps = 260e6;

using workload::Tally;

char* New(size_t n, uint64_t tag, Tally& t) { return workload::New(kName, n, tag, t); }
void Delete(char* p, Tally& t) { workload::Delete(p, kMinSize, kMaxSize, t); }

void Worker(int id, long steps, Tally& tally) {
  workload::Rng rng(5000 + id);
  Tally t;
  char* window[kWindow];
  for (char*& p : window) p = New(kMinSize + rng.Next() % (kMaxSize - kMinSize + 1), rng.Next(), t);
  for (long s = 0; s < steps; s++) {
    uint64_t r = rng.Next();
    char*& slot = window[r % kWindow];
    Delete(slot, t);
    // The tag is r itself: one random number per step keeps the loop tight.
    slot = New(kMinSize + (r >> 16) % (kMaxSize - kMinSize + 1), r, t);
  }
  for (char* p : window) Delete(p, t);
  tally = t;
}

}  // namespace

int main(int argc, char** argv) {
  const workload::Args args = workload::ParseArgs(argc, argv);
  const int threads = args.threads;
  const long steps = workload::Share(kTotalSteps, args);
  std::vector<Tally> tallies(threads);

  return workload::Run(
      kName, threads, workload::OneThread::kMainThread, [&](int i) { Worker(i, steps, tallies[i]); },
      [&]() -> workload::Ops {
        Tally sum;
        for (const Tally& t : tallies) sum.Add(t);
        uint64_t expect = static_cast<uint64_t>(threads) * (2 * kWindow + 2ull * steps);
        if (!sum.Balanced() || sum.ops != expect) {
          fprintf(stderr, "small_loop: verification failed: bad=%llu made=%llu freed=%llu tags %s ops=%llu\n",
                  (unsigned long long)sum.bad, (unsigned long long)sum.made, (unsigned long long)sum.freed,
                  sum.tag_in == sum.tag_out ? "match" : "differ", (unsigned long long)sum.ops);
          return std::nullopt;
        }
        return sum.ops;
      });
}
