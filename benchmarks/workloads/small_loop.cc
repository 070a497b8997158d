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
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

namespace {

constexpr size_t kMinSize = 16;
constexpr size_t kMaxSize = 256;
constexpr size_t kWindow = 64;
constexpr double kTotalSteps = 260e6;

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
  uint64_t ops = 0, made = 0, freed = 0, tag_in = 0, tag_out = 0, bad = 0;
};

// Object layout: bytes 0..7 tag, 8..11 size, last byte a check byte.
char* New(size_t n, uint64_t tag, Tally& t) {
  char* p = static_cast<char*>(malloc(n));
  if (p == nullptr) {
    fprintf(stderr, "small_loop: malloc(%zu) failed\n", n);
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

void Worker(int id, long steps, Tally& tally) {
  Rng rng(5000 + id);
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
  long steps = static_cast<long>(kTotalSteps * scale / threads);
  if (steps < 1) steps = 1;
  std::vector<Tally> tallies(threads);

  auto t0 = std::chrono::steady_clock::now();
  if (threads == 1) {
    Worker(0, steps, tallies[0]);  // no thread at all: the plain single-thread case
  } else {
    std::vector<std::thread> ts;
    for (int i = 0; i < threads; i++) ts.emplace_back(Worker, i, steps, std::ref(tallies[i]));
    for (auto& th : ts) th.join();
  }
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
  uint64_t expect = static_cast<uint64_t>(threads) * (2 * kWindow + 2ull * steps);
  if (sum.bad != 0 || sum.made != sum.freed || sum.tag_in != sum.tag_out || sum.ops != expect) {
    fprintf(stderr, "small_loop: verification failed: bad=%llu made=%llu freed=%llu tags %s ops=%llu\n",
            (unsigned long long)sum.bad, (unsigned long long)sum.made, (unsigned long long)sum.freed,
            sum.tag_in == sum.tag_out ? "match" : "differ", (unsigned long long)sum.ops);
    return 1;
  }
  printf("workload=small_loop threads=%d ops=%llu seconds=%.3f ops_per_s=%.0f\n", threads,
         (unsigned long long)sum.ops, secs, static_cast<double>(sum.ops) / secs);
  return 0;
}
