// What the allocator workloads share (conventions in README.md): the command
// line, the per-thread generator, running and timing the workers with the one
// result line, and the tagged objects most of them check.
#ifndef BENCHMARKS_WORKLOADS_WORKLOAD_H_
#define BENCHMARKS_WORKLOADS_WORKLOAD_H_

#include <pthread.h>
#include <sched.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <thread>
#include <vector>

namespace workload {

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

struct Args {
  int threads = 1;     // 1..256
  double scale = 1.0;  // (0, 1000]
};

// PROG [threads=1] [scale=1.0]. Bad arguments: usage on stderr, exit 2.
// `count` names the first argument in the usage (xmalloc counts pairs).
inline Args ParseArgs(int argc, char** argv, const char* count = "threads") {
  Args a;
  bool ok = argc <= 3;
  char* end;
  if (ok && argc > 1) {
    long v = strtol(argv[1], &end, 10);
    ok = *end == '\0' && v >= 1 && v <= 256;
    a.threads = static_cast<int>(v);
  }
  if (ok && argc > 2) {
    double v = strtod(argv[2], &end);
    ok = *end == '\0' && v > 0 && v <= 1000;
    a.scale = v;
  }
  if (!ok) {
    fprintf(stderr, "usage: %s [%s=1] [scale=1.0]\n", argv[0], count);
    exit(2);
  }
  return a;
}

// One thread's even share of total * scale units of work, split further into
// `parts` (larson's epochs); at least 1.
inline long Share(double total, const Args& a, int parts = 1) {
  long n = static_cast<long>(total * a.scale / a.threads / parts);
  return n < 1 ? 1 : n;
}

// kMainThread: a one-thread run stays in the main thread, as a single-threaded
// program would (glibc's main arena, jemalloc's arena 0).
enum class OneThread { kNewThread, kMainThread };

// Runs work(0) .. work(n - 1), each in a new thread, and joins them.
template <typename Work>
void RunThreads(int n, OneThread one, const Work& work) {
  if (n == 1 && one == OneThread::kMainThread) {
    work(0);
    return;
  }
  std::vector<std::thread> ts;
  for (int i = 0; i < n; i++) ts.emplace_back([&work, i] { work(i); });
  for (std::thread& t : ts) t.join();
}

// Pins the calling thread to the k-th CPU it may run on (modulo their
// number). For workloads whose threads hand work to each other: left to the
// scheduler, a pair sometimes shares a core and sometimes not, and the
// throughput of the same run jumps fourfold between the two.
inline void PinToCpu(int k) {
  cpu_set_t allowed;
  if (sched_getaffinity(0, sizeof allowed, &allowed) != 0) return;
  int n = CPU_COUNT(&allowed);
  if (n <= 0) return;
  int want = k % n;
  for (int cpu = 0; cpu < CPU_SETSIZE; cpu++) {
    if (!CPU_ISSET(cpu, &allowed) || want-- != 0) continue;
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(cpu, &one);
    pthread_setaffinity_np(pthread_self(), sizeof one, &one);
    return;
  }
}

// What verify() returns: the op count, or nothing when the check failed (it has
// then said why on stderr).
using Ops = std::optional<uint64_t>;

// Times body() (wall clock), then verify(); prints the one result line only if
// the check passed. Returns main's exit code: 0, or 1 when the check failed.
template <typename Body, typename Verify>
int Measure(const char* name, int threads, const Body& body, const Verify& verify) {
  auto t0 = std::chrono::steady_clock::now();
  body();
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  Ops ops = verify();
  if (!ops) return 1;
  printf("workload=%s threads=%d ops=%llu seconds=%.3f ops_per_s=%.0f\n", name, threads,
         (unsigned long long)*ops, secs, static_cast<double>(*ops) / secs);
  return 0;
}

// The usual case: only the threads' work is timed.
template <typename Work, typename Verify>
int Run(const char* name, int threads, OneThread one, const Work& work, const Verify& verify) {
  return Measure(name, threads, [&] { RunThreads(threads, one, work); }, verify);
}

// Allocation failure ends the run (exit 1): there is nothing left to measure.
inline void* Malloc(const char* name, size_t n) {
  void* p = malloc(n);
  if (p == nullptr) {
    fprintf(stderr, "%s: malloc(%zu) failed\n", name, n);
    exit(1);
  }
  return p;
}

// Tagged objects: bytes 0..7 a random tag, 8..11 the size, the last byte a
// check byte derived from the tag, so whoever frees one can tell whether it
// was overwritten or handed out twice.
inline unsigned char CheckByte(uint64_t tag) { return static_cast<unsigned char>((tag >> 56) ^ tag ^ 0xA5); }

inline void Stamp(char* p, size_t n, uint64_t tag) {
  uint32_t n32 = static_cast<uint32_t>(n);
  memcpy(p, &tag, 8);
  memcpy(p + 8, &n32, 4);
  p[n - 1] = static_cast<char>(CheckByte(tag));
}

// Returns the tag; counts the object in `bad` if its size is outside
// [min_size, max_size] (then the check byte is not read) or its check byte is wrong.
inline uint64_t Check(const char* p, size_t min_size, size_t max_size, uint64_t& bad) {
  uint64_t tag;
  uint32_t n;
  memcpy(&tag, p, 8);
  memcpy(&n, p + 8, 4);
  if (n < min_size || n > max_size || static_cast<unsigned char>(p[n - 1]) != CheckByte(tag)) bad++;
  return tag;
}

// Per-thread counts for tagged objects; a correct run frees every object it
// made (same count, same sum of tags) and finds none bad.
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
  bool Balanced() const { return bad == 0 && made == freed && tag_in == tag_out; }
};

inline char* New(const char* name, size_t n, uint64_t tag, Tally& t) {
  char* p = static_cast<char*>(Malloc(name, n));
  Stamp(p, n, tag);
  t.ops++;
  t.made++;
  t.tag_in += tag;
  return p;
}

inline void Delete(char* p, size_t min_size, size_t max_size, Tally& t) {
  t.tag_out += Check(p, min_size, max_size, t.bad);
  t.freed++;
  t.ops++;
  free(p);
}

}  // namespace workload

#endif  // BENCHMARKS_WORKLOADS_WORKLOAD_H_
