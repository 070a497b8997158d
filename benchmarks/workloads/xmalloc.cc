// xmalloc: producer/consumer cross-thread frees. One op = one malloc or one free.
//
// Usage: xmalloc [threads=1] [scale=1.0]
// threads = number of producer/consumer PAIRS (so 2*threads threads run).
// Producer i allocates objects of random size (16..512 B), writes them and
// passes them in batches of kBatch through a bounded lock-free
// single-producer/single-consumer ring to consumer i, which checks and frees
// them: every free is a cross-thread free. Threads are pinned (worker w to
// the w-th CPU), so that runs compare: unpinned, the throughput jumped
// fourfold between runs with the scheduler's placement. The total work is fixed,
// kTotalObjects * scale objects, split evenly among the producers. Every
// object carries a tag, its size and a check byte; the consumer verifies them
// and the sums of tags produced and consumed must agree.
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <thread>
#include <vector>

#include "benchmarks/workloads/workload.h"

namespace {

constexpr char kName[] = "xmalloc";
constexpr size_t kMinSize = 16;
constexpr size_t kMaxSize = 512;
constexpr size_t kBatch = 128;   // objects per batch
constexpr size_t kRing = 64;     // batches in flight per pair
constexpr double kTotalObjects = 40e6;

struct Tally {
  uint64_t ops = 0, count = 0, tags = 0, bad = 0;
};

// One producer/consumer pair. Positions count batches; they only grow.
struct Ring {
  alignas(64) std::atomic<uint64_t> head{0};  // next batch the consumer takes
  alignas(64) std::atomic<uint64_t> tail{0};  // next batch the producer fills
  alignas(64) std::atomic<bool> done{false};
  alignas(64) uint32_t counts[kRing];
  char* objs[kRing][kBatch];
};

void Producer(int id, uint64_t objects, Ring& ring, Tally& tally) {
  workload::Rng rng(2000 + id);
  Tally t;
  uint64_t tail = 0;
  while (objects > 0) {
    while (tail - ring.head.load(std::memory_order_acquire) == kRing) std::this_thread::yield();
    size_t slot = tail % kRing;
    size_t n = objects < kBatch ? static_cast<size_t>(objects) : kBatch;
    for (size_t i = 0; i < n; i++) {
      uint64_t r = rng.Next();
      size_t size = kMinSize + r % (kMaxSize - kMinSize + 1);
      uint64_t tag = rng.Next();
      char* p = static_cast<char*>(workload::Malloc(kName, size));
      workload::Stamp(p, size, tag);
      ring.objs[slot][i] = p;
      t.tags += tag;
    }
    ring.counts[slot] = static_cast<uint32_t>(n);
    t.count += n;
    t.ops += n;
    objects -= n;
    ring.tail.store(++tail, std::memory_order_release);
  }
  ring.done.store(true, std::memory_order_release);
  tally = t;
}

void Consumer(Ring& ring, Tally& tally) {
  Tally t;
  uint64_t head = 0;
  for (;;) {
    if (head == ring.tail.load(std::memory_order_acquire)) {
      if (ring.done.load(std::memory_order_acquire) && head == ring.tail.load(std::memory_order_acquire)) break;
      std::this_thread::yield();
      continue;
    }
    size_t slot = head % kRing;
    size_t n = ring.counts[slot];
    for (size_t i = 0; i < n; i++) {
      char* p = ring.objs[slot][i];
      t.tags += workload::Check(p, kMinSize, kMaxSize, t.bad);
      free(p);
    }
    t.count += n;
    t.ops += n;
    ring.head.store(++head, std::memory_order_release);
  }
  tally = t;
}

}  // namespace

int main(int argc, char** argv) {
  const workload::Args args = workload::ParseArgs(argc, argv, "pairs");
  const int threads = args.threads;
  const uint64_t per_producer = workload::Share(kTotalObjects, args);
  std::unique_ptr<Ring[]> rings(new Ring[threads]);
  std::vector<Tally> made(threads), freed(threads);

  return workload::Measure(
      kName, threads,
      [&] {
        // Worker 2i is consumer i, 2i + 1 producer i; worker w runs on CPU
        // w (mod CPUs): a pair on two cores when there are two, every free
        // a cross-core free.
        workload::RunThreads(2 * threads, workload::OneThread::kNewThread, [&](int w) {
          workload::PinToCpu(w);
          int i = w / 2;
          if (w % 2 == 0) {
            Consumer(rings[i], freed[i]);
          } else {
            Producer(i, per_producer, rings[i], made[i]);
          }
        });
      },
      [&]() -> workload::Ops {
        uint64_t ops = 0, bad = 0, count_in = 0, count_out = 0, tags_in = 0, tags_out = 0;
        for (int i = 0; i < threads; i++) {
          ops += made[i].ops + freed[i].ops;
          bad += freed[i].bad;
          count_in += made[i].count;
          count_out += freed[i].count;
          tags_in += made[i].tags;
          tags_out += freed[i].tags;
        }
        uint64_t expect = 2 * per_producer * threads;
        if (bad != 0 || count_in != count_out || tags_in != tags_out || ops != expect) {
          fprintf(stderr,
                  "xmalloc: verification failed: bad=%llu made=%llu freed=%llu tags %s ops=%llu expected=%llu\n",
                  (unsigned long long)bad, (unsigned long long)count_in, (unsigned long long)count_out,
                  tags_in == tags_out ? "match" : "differ", (unsigned long long)ops, (unsigned long long)expect);
          return std::nullopt;
        }
        return ops;
      });
}
