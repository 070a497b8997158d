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
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <thread>
#include <vector>

namespace {

constexpr size_t kMinSize = 16;
constexpr size_t kMaxSize = 1024;
constexpr size_t kSlots = 4096;
constexpr int kEpochs = 40;
constexpr double kTotalSteps = 130e6;

// xorshift64, seeded through splitmix64 so that small seeds give good streams.
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

// Object layout: bytes 0..7 tag, 8..11 size, last byte a check byte.
unsigned char CheckByte(uint64_t tag) { return static_cast<unsigned char>((tag >> 56) ^ tag ^ 0xA5); }

struct Tally {
  uint64_t ops = 0, made = 0, freed = 0, tag_in = 0, tag_out = 0, bad = 0;
};

char* New(size_t n, uint64_t tag, Tally& t) {
  char* p = static_cast<char*>(malloc(n));
  if (p == nullptr) {
    fprintf(stderr, "larson: malloc(%zu) failed\n", n);
    exit(1);
  }
  uint32_t n32 = static_cast<uint32_t>(n);
  memcpy(p, &tag, 8);
  memcpy(p + 8, &n32, 4);
  p[n - 1] = static_cast<char>(CheckByte(tag));
  t.ops++;
  t.made++;
  t.tag_in += tag;
  return p;
}

void Delete(char* p, Tally& t) {
  uint64_t tag;
  uint32_t n;
  memcpy(&tag, p, 8);
  memcpy(&n, p + 8, 4);
  if (n < kMinSize || n > kMaxSize || static_cast<unsigned char>(p[n - 1]) != CheckByte(tag)) t.bad++;
  t.tag_out += tag;
  t.freed++;
  t.ops++;
  free(p);
}

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
  Rng rng(1000 + id);
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
    fprintf(stderr, "usage: %s [threads=1] [scale=1.0]\n", argv[0]);
    return 2;
  }
  long steps_per_epoch = static_cast<long>(kTotalSteps * scale / threads / kEpochs);
  if (steps_per_epoch < 1) steps_per_epoch = 1;
  std::vector<std::vector<char*>> arrays(threads, std::vector<char*>(kSlots, nullptr));
  std::vector<Tally> tallies(threads);
  Barrier barrier(threads);

  auto t0 = std::chrono::steady_clock::now();
  std::vector<std::thread> ts;
  for (int i = 0; i < threads; i++)
    ts.emplace_back(Worker, i, threads, steps_per_epoch, std::ref(arrays), std::ref(barrier),
                    std::ref(tallies[i]));
  for (auto& th : ts) th.join();
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  Tally sum;
  for (const Tally& t : tallies) {
    sum.ops += t.ops;
    sum.made += t.made;
    sum.freed += t.freed;
    sum.tag_in += t.tag_in;
    sum.tag_out += t.tag_out;
    sum.bad += t.bad;
  }
  uint64_t expect = static_cast<uint64_t>(threads) * (2 * kSlots + 2ull * kEpochs * steps_per_epoch);
  if (sum.bad != 0 || sum.made != sum.freed || sum.tag_in != sum.tag_out || sum.ops != expect) {
    fprintf(stderr,
            "larson: verification failed: bad=%llu made=%llu freed=%llu tags %s ops=%llu expected=%llu\n",
            (unsigned long long)sum.bad, (unsigned long long)sum.made, (unsigned long long)sum.freed,
            sum.tag_in == sum.tag_out ? "match" : "differ", (unsigned long long)sum.ops,
            (unsigned long long)expect);
    return 1;
  }
  printf("workload=larson threads=%d ops=%llu seconds=%.3f ops_per_s=%.0f\n", threads,
         (unsigned long long)sum.ops, secs, static_cast<double>(sum.ops) / secs);
  return 0;
}
