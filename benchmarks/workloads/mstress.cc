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
constexpr size_t kMaxSize = 1 << 20;
constexpr size_t kWindow = 1024;      // per thread
constexpr size_t kSharedPerThread = 256;
constexpr long kStepsPerRound = 200000;
constexpr double kTotalSteps = 32e6;

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

size_t PickSize(uint64_t r) {
  unsigned bucket = static_cast<unsigned>(r % 1000);
  r >>= 10;
  if (bucket < 900) return kMinSize + r % (1024 - kMinSize + 1);
  if (bucket < 995) return 1024 + r % ((64 << 10) - 1024 + 1);
  return (64 << 10) + r % (kMaxSize - (64 << 10) + 1);
}

unsigned char CheckByte(uint64_t tag) { return static_cast<unsigned char>((tag >> 56) ^ tag ^ 0xA5); }

struct Tally {
  uint64_t ops = 0, made = 0, freed = 0, tag_in = 0, tag_out = 0, bad = 0;
  void Add(const Tally& o) {
    ops += o.ops;
    made += o.made;
    freed += o.freed;
    tag_in += o.tag_in;
    tag_out += o.tag_out;
    bad += o.bad;
  }
};

[[noreturn]] void OutOfMemory(size_t n) {
  fprintf(stderr, "mstress: allocation of %zu bytes failed\n", n);
  exit(1);
}

// Object layout: bytes 0..7 tag, 8..11 size, last byte a check byte.
void Stamp(char* p, size_t n, uint64_t tag) {
  uint32_t n32 = static_cast<uint32_t>(n);
  memcpy(p, &tag, 8);
  memcpy(p + 8, &n32, 4);
  p[n - 1] = static_cast<char>(CheckByte(tag));
}

// Returns the tag; counts a corrupt object in t.bad.
uint64_t Check(const char* p, Tally& t) {
  uint64_t tag;
  uint32_t n;
  memcpy(&tag, p, 8);
  memcpy(&n, p + 8, 4);
  if (n < kMinSize || n > kMaxSize || static_cast<unsigned char>(p[n - 1]) != CheckByte(tag)) t.bad++;
  return tag;
}

char* New(size_t n, uint64_t tag, Tally& t) {
  char* p = static_cast<char*>(malloc(n));
  if (p == nullptr) OutOfMemory(n);
  Stamp(p, n, tag);
  t.ops++;
  t.made++;
  t.tag_in += tag;
  return p;
}

void Delete(char* p, Tally& t) {
  t.tag_out += Check(p, t);
  t.freed++;
  t.ops++;
  free(p);
}

char* Resize(char* p, size_t n, Tally& t) {
  uint64_t tag = Check(p, t);
  char* q = static_cast<char*>(realloc(p, n));
  if (q == nullptr) OutOfMemory(n);
  uint64_t kept;
  memcpy(&kept, q, 8);
  if (kept != tag) t.bad++;  // realloc must keep the contents
  Stamp(q, n, tag);
  t.ops++;
  return q;
}

void Worker(int id, long steps, std::atomic<char*>* shared, size_t shared_slots, Tally& tally) {
  Rng rng(4000 + id);
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
  size_t shared_slots = kSharedPerThread * threads;
  std::unique_ptr<std::atomic<char*>[]> shared(new std::atomic<char*>[shared_slots]);
  for (size_t i = 0; i < shared_slots; i++) shared[i].store(nullptr);
  std::vector<Tally> tallies(threads);

  auto t0 = std::chrono::steady_clock::now();
  std::vector<std::thread> ts;
  for (int i = 0; i < threads; i++)
    ts.emplace_back(Worker, i, steps, shared.get(), shared_slots, std::ref(tallies[i]));
  for (auto& th : ts) th.join();
  Tally sum;
  for (size_t i = 0; i < shared_slots; i++) {
    char* p = shared[i].exchange(nullptr);
    if (p != nullptr) Delete(p, sum);
  }
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  for (const Tally& t : tallies) sum.Add(t);
  if (sum.bad != 0 || sum.made != sum.freed || sum.tag_in != sum.tag_out) {
    fprintf(stderr, "mstress: verification failed: bad=%llu made=%llu freed=%llu tags %s\n",
            (unsigned long long)sum.bad, (unsigned long long)sum.made, (unsigned long long)sum.freed,
            sum.tag_in == sum.tag_out ? "match" : "differ");
    return 1;
  }
  printf("workload=mstress threads=%d ops=%llu seconds=%.3f ops_per_s=%.0f\n", threads,
         (unsigned long long)sum.ops, secs, static_cast<double>(sum.ops) / secs);
  return 0;
}
