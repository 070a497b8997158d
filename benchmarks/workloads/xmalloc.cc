// xmalloc: producer/consumer cross-thread frees. One op = one malloc or one free.
//
// Usage: xmalloc [threads=1] [scale=1.0]
// threads = number of producer/consumer PAIRS (so 2*threads threads run).
// Producer i allocates objects of random size (16..512 B), writes them and
// passes them in batches of kBatch through a bounded lock-free
// single-producer/single-consumer ring to consumer i, which checks and frees
// them: every free is a cross-thread free. The total work is fixed,
// kTotalObjects * scale objects, split evenly among the producers. Every
// object carries a tag, its size and a check byte; the consumer verifies them
// and the sums of tags produced and consumed must agree.
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

namespace {

constexpr size_t kMinSize = 16;
constexpr size_t kMaxSize = 512;
constexpr size_t kBatch = 128;   // objects per batch
constexpr size_t kRing = 64;     // batches in flight per pair
constexpr double kTotalObjects = 40e6;

class Rng {
 public:
  explicit Rng(uint64_t seed) {
    uint64_t z = seed + 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    s_ = (z ^ (z >> 31)) | 1;
  }
  uint64_t Next() {
    s_ ^= s_ << 13;
    s_ ^= s_ >> 7;
    s_ ^= s_ << 17;
    return s_;
  }

 private:
  uint64_t s_;
};

unsigned char CheckByte(uint64_t tag) { return static_cast<unsigned char>((tag >> 56) ^ tag ^ 0xA5); }

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
  Rng rng(2000 + id);
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
      char* p = static_cast<char*>(malloc(size));
      if (p == nullptr) {
        fprintf(stderr, "xmalloc: malloc(%zu) failed\n", size);
        exit(1);
      }
      uint32_t s32 = static_cast<uint32_t>(size);
      memcpy(p, &tag, 8);
      memcpy(p + 8, &s32, 4);
      p[size - 1] = static_cast<char>(CheckByte(tag));
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
      uint64_t tag;
      uint32_t size;
      memcpy(&tag, p, 8);
      memcpy(&size, p + 8, 4);
      if (size < kMinSize || size > kMaxSize || static_cast<unsigned char>(p[size - 1]) != CheckByte(tag)) t.bad++;
      t.tags += tag;
      free(p);
    }
    t.count += n;
    t.ops += n;
    ring.head.store(++head, std::memory_order_release);
  }
  tally = t;
}

bool ParseArgs(int argc, char** argv, int* threads, double* scale) {
  if (argc > 3) return false;
  char* end;
  if (argc > 1) {
    long v = strtol(argv[1], &end, 10);
    if (*end != '\0' || v < 1 || v > 256) return false;
    *threads = static_cast<int>(v);
  }
  if (argc > 2) {
    double v = strtod(argv[2], &end);
    if (*end != '\0' || !(v > 0) || v > 1000) return false;
    *scale = v;
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  int threads = 1;
  double scale = 1.0;
  if (!ParseArgs(argc, argv, &threads, &scale)) {
    fprintf(stderr, "usage: %s [pairs=1] [scale=1.0]\n", argv[0]);
    return 2;
  }
  uint64_t per_producer = static_cast<uint64_t>(kTotalObjects * scale / threads);
  if (per_producer < 1) per_producer = 1;
  std::unique_ptr<Ring[]> rings(new Ring[threads]);
  std::vector<Tally> made(threads), freed(threads);

  auto t0 = std::chrono::steady_clock::now();
  std::vector<std::thread> ts;
  for (int i = 0; i < threads; i++) {
    ts.emplace_back(Consumer, std::ref(rings[i]), std::ref(freed[i]));
    ts.emplace_back(Producer, i, per_producer, std::ref(rings[i]), std::ref(made[i]));
  }
  for (auto& th : ts) th.join();
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

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
    fprintf(stderr, "xmalloc: verification failed: bad=%llu made=%llu freed=%llu tags %s ops=%llu expected=%llu\n",
            (unsigned long long)bad, (unsigned long long)count_in, (unsigned long long)count_out,
            tags_in == tags_out ? "match" : "differ", (unsigned long long)ops, (unsigned long long)expect);
    return 1;
  }
  printf("workload=xmalloc threads=%d ops=%llu seconds=%.3f ops_per_s=%.0f\n", threads,
         (unsigned long long)ops, secs, static_cast<double>(ops) / secs);
  return 0;
}
