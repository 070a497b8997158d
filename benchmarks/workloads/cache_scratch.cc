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
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>

namespace {

constexpr size_t kObjSize = 8;
constexpr int kWrites = 1000;
constexpr double kTotalIterations = 1e6;

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

struct Tally {
  uint64_t ops = 0, sum = 0, expect = 0, bad = 0;
};

void Worker(int id, char* handed, long iterations, Tally& tally) {
  Rng rng(3000 + id);
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
  long iterations = static_cast<long>(kTotalIterations * scale / threads);
  if (iterations < 1) iterations = 1;
  std::vector<Tally> tallies(threads);

  auto t0 = std::chrono::steady_clock::now();
  // Allocated back to back by one thread: neighbours, as in the original test.
  std::vector<char*> handed(threads);
  for (int i = 0; i < threads; i++) {
    handed[i] = static_cast<char*>(malloc(kObjSize));
    if (handed[i] == nullptr) return 1;
    handed[i][0] = static_cast<char>(i);
    handed[i][kObjSize - 1] = static_cast<char>(i);
  }
  std::vector<std::thread> ts;
  for (int i = 0; i < threads; i++) ts.emplace_back(Worker, i, handed[i], iterations, std::ref(tallies[i]));
  for (auto& th : ts) th.join();
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

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
    return 1;
  }
  printf("workload=cache_scratch threads=%d ops=%llu seconds=%.3f ops_per_s=%.0f\n", threads,
         (unsigned long long)ops, secs, static_cast<double>(ops) / secs);
  return 0;
}
