// mstress: mixed-size churn with varied lifetimes. One op = one malloc, one free or one realloc.
//
// Usage: mstress [threads=1] [scale=1.0]
// Sizes: 90% 16 B..1 KiB, 9.5% 1..64 KiB, 0.5% 64 KiB..1 MiB. Each step of a
// thread picks one action:
//   50% replace a random slot of its window of kWindow live objects,
//   30% malloc an object and free it at once,
//   15% swap a new object into a random slot of an array shared by all
//       threads (atomic exchange) and free what was there, often an object
//       another thread allocated,
//    5% realloc a random window slot to a new random size.
// Every kStepsPerRound steps the thread frees its whole window (end of a
// "request"); the main thread frees what is left in the shared array. The
// total work is fixed, kTotalSteps * scale steps, split evenly among the
// threads. Every object carries a tag, its size and a check byte; frees and
// reallocs verify them, and the sum of tags freed must equal the sum made.
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

#include "benchmarks/workloads/workload.h"

namespace {

constexpr char kName[] = "mstress";
constexpr size_t kMinSize = 16;
constexpr size_t kMaxSize = 1 << 20;
constexpr size_t kWindow = 1024;      // per thread
constexpr size_t kSharedPerThread = 256;
constexpr long kStepsPerRound = 200000;
constexpr double kTotalSteps = 32e6;

using workload::Tally;

size_t PickSize(uint64_t r) {
  unsigned bucket = static_cast<unsigned>(r % 1000);
  r >>= 10;
  if (bucket < 900) return kMinSize + r % (1024 - kMinSize + 1);
  if (bucket < 995) return 1024 + r % ((64 << 10) - 1024 + 1);
  return (64 << 10) + r % (kMaxSize - (64 << 10) + 1);
}

[[noreturn]] void OutOfMemory(size_t n) {
  fprintf(stderr, "mstress: allocation of %zu bytes failed\n", n);
  exit(1);
}

char* New(size_t n, uint64_t tag, Tally& t) {
  char* p = static_cast<char*>(malloc(n));
  if (p == nullptr) OutOfMemory(n);
  workload::Stamp(p, n, tag);
  t.ops++;
  t.made++;
  t.tag_in += tag;
  return p;
}

void Delete(char* p, Tally& t) { workload::Delete(p, kMinSize, kMaxSize, t); }

char* Resize(char* p, size_t n, Tally& t) {
  uint64_t tag = workload::Check(p, kMinSize, kMaxSize, t.bad);
  char* q = static_cast<char*>(realloc(p, n));
  if (q == nullptr) OutOfMemory(n);
  uint64_t kept;
  memcpy(&kept, q, 8);
  if (kept != tag) t.bad++;  // realloc must keep the contents
  workload::Stamp(q, n, tag);
  t.ops++;
  return q;
}

void Worker(int id, long steps, std::atomic<char*>* shared, size_t shared_slots, Tally& tally) {
  workload::Rng rng(4000 + id);
  Tally t;
  std::vector<char*> window(kWindow, nullptr);
  for (long s = 0; s < steps; s++) {
    uint64_t r = rng.Next();
    unsigned action = static_cast<unsigned>(r % 100);
    r >>= 7;
    size_t n = PickSize(rng.Next());
    if (action < 50) {
      char*& slot = window[r % kWindow];
      if (slot != nullptr) Delete(slot, t);
      slot = New(n, rng.Next(), t);
    } else if (action < 80) {
      Delete(New(n, rng.Next(), t), t);
    } else if (action < 95) {
      char* old = shared[r % shared_slots].exchange(New(n, rng.Next(), t), std::memory_order_acq_rel);
      if (old != nullptr) Delete(old, t);
    } else {
      char*& slot = window[r % kWindow];
      slot = slot != nullptr ? Resize(slot, n, t) : New(n, rng.Next(), t);
    }
    if ((s + 1) % kStepsPerRound == 0 || s + 1 == steps) {
      for (char*& p : window) {
        if (p != nullptr) Delete(p, t);
        p = nullptr;
      }
    }
  }
  tally = t;
}

}  // namespace

int main(int argc, char** argv) {
  const workload::Args args = workload::ParseArgs(argc, argv);
  const int threads = args.threads;
  const long steps = workload::Share(kTotalSteps, args);
  size_t shared_slots = kSharedPerThread * threads;
  std::unique_ptr<std::atomic<char*>[]> shared(new std::atomic<char*>[shared_slots]);
  for (size_t i = 0; i < shared_slots; i++) shared[i].store(nullptr);
  std::vector<Tally> tallies(threads);
  Tally sum;

  return workload::Measure(
      kName, threads,
      [&] {
        workload::RunThreads(threads, workload::OneThread::kNewThread,
                             [&](int i) { Worker(i, steps, shared.get(), shared_slots, tallies[i]); });
        for (size_t i = 0; i < shared_slots; i++) {
          char* p = shared[i].exchange(nullptr);
          if (p != nullptr) Delete(p, sum);
        }
      },
      [&]() -> workload::Ops {
        for (const Tally& t : tallies) sum.Add(t);
        if (!sum.Balanced()) {
          fprintf(stderr, "mstress: verification failed: bad=%llu made=%llu freed=%llu tags %s\n",
                  (unsigned long long)sum.bad, (unsigned long long)sum.made, (unsigned long long)sum.freed,
                  sum.tag_in == sum.tag_out ? "match" : "differ");
          return std::nullopt;
        }
        return sum.ops;
      });
}
