// larson: server simulation with rotating object arrays. One op = one malloc or one free (initial fill and final cleanup included).
//
// Usage: larson [threads=1] [scale=1.0]
// Each thread fills an array of kSlots objects of random size (16..1024 B),
// then runs kEpochs epochs; a step frees a random slot and puts a new object
// of random size in it. After every epoch the threads pass the arrays on:
// in epoch e thread i works on array (i + e) % threads, so objects are freed
// by threads that did not allocate them (with one thread there is nothing to
// pass). The total work is fixed, kTotalSteps * scale steps, split evenly
// among the threads. Every object carries a tag, its
// size and a check byte; each free verifies them and the sum of tags freed
// must equal the sum allocated.
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <mutex>
#include <vector>

#include "benchmarks/workloads/workload.h"

namespace {

constexpr char kName[] = "larson";
constexpr size_t kMinSize = 16;
constexpr size_t kMaxSize = 1024;
constexpr size_t kSlots = 4096;
constexpr int kEpochs = 40;
constexpr double kTotalSteps = 130e6;

using workload::Tally;

char* New(size_t n, uint64_t tag, Tally& t) { return workload::New(kName, n, tag, t); }
void Delete(char* p, Tally& t) { workload::Delete(p, kMinSize, kMaxSize, t); }

class Barrier {
 public:
  explicit Barrier(int n) : n_(n) {}
  void Wait() {
    std::unique_lock<std::mutex> lock(mu_);
    uint64_t gen = gen_;
    if (++count_ == n_) {
      count_ = 0;
      gen_++;
      cv_.notify_all();
    } else {
      cv_.wait(lock, [&] { return gen_ != gen; });
    }
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  int n_;
  int count_ = 0;
  uint64_t gen_ = 0;
};

void Worker(int id, int threads, long steps_per_epoch, std::vector<std::vector<char*>>& arrays,
            Barrier& barrier, Tally& tally) {
  workload::Rng rng(1000 + id);
  Tally t;
  auto size = [&](uint64_t r) { return kMinSize + r % (kMaxSize - kMinSize + 1); };
  for (char*& slot : arrays[id]) slot = New(size(rng.Next()), rng.Next(), t);
  barrier.Wait();
  for (int e = 0; e < kEpochs; e++) {
    std::vector<char*>& a = arrays[(id + e) % threads];
    for (long s = 0; s < steps_per_epoch; s++) {
      uint64_t r = rng.Next();
      char*& slot = a[r % kSlots];
      Delete(slot, t);
      slot = New(size(r >> 20), rng.Next(), t);
    }
    barrier.Wait();  // then hand the array on
  }
  for (char*& slot : arrays[(id + kEpochs) % threads]) {
    Delete(slot, t);
    slot = nullptr;
  }
  tally = t;
}

}  // namespace

int main(int argc, char** argv) {
  const workload::Args args = workload::ParseArgs(argc, argv);
  const int threads = args.threads;
  const long steps_per_epoch = workload::Share(kTotalSteps, args, kEpochs);
  std::vector<std::vector<char*>> arrays(threads, std::vector<char*>(kSlots, nullptr));
  std::vector<Tally> tallies(threads);
  Barrier barrier(threads);

  return workload::Run(
      kName, threads, workload::OneThread::kNewThread,
      [&](int i) { Worker(i, threads, steps_per_epoch, arrays, barrier, tallies[i]); },
      [&]() -> workload::Ops {
        Tally sum;
        for (const Tally& t : tallies) sum.Add(t);
        uint64_t expect = static_cast<uint64_t>(threads) * (2 * kSlots + 2ull * kEpochs * steps_per_epoch);
        if (!sum.Balanced() || sum.ops != expect) {
          fprintf(stderr,
                  "larson: verification failed: bad=%llu made=%llu freed=%llu tags %s ops=%llu expected=%llu\n",
                  (unsigned long long)sum.bad, (unsigned long long)sum.made, (unsigned long long)sum.freed,
                  sum.tag_in == sum.tag_out ? "match" : "differ", (unsigned long long)sum.ops,
                  (unsigned long long)expect);
          return std::nullopt;
        }
        return sum.ops;
      });
}
