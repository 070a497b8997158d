// fork_matrix: one program for the fork test matrix (docs/TESTING.md, "The
// fork matrix"). It is NOT linked against rdmalloc: the same binary runs under
// LD_PRELOAD of stock jemalloc or of librdmalloc.so, and finds jemalloc's and
// rdmalloc's entry points with dlsym. It starts threads that keep the heap busy
// (the workload), forks --forks children one after the other, each doing one
// child action, and checks every child's exit status and its own heap after
// every fork.
//
//   fork_matrix --workload=W --child=C [--forks=N] [options]
//
// Workloads (each also runs byte-pattern churn threads, whose checks are the
// parent's proof that its heap still works):
//   plain      2 threads malloc/free small blocks and 64 KiB - 4 MiB blocks
//   purge      threads churning large blocks + a thread doing
//              mallctl arena.<all>.purge and arena.<all>.decay
//   arena      a thread looping arenas.create, mallocx(MALLOCX_ARENA(i) |
//              MALLOCX_TCACHE_NONE), dallocx, arena.<i>.destroy
//   class      rdmalloc_alloc with RDMALLOC_REMOTE_* flags (rdmalloc only)
//   observers  an rdmalloc_on_release observer whose callback takes a mutex
//              and mallocs, with large-block churn and purges (rdmalloc only)
//   lookups    rdmalloc_lookup on every buffer (registrations live at fork)
//              and purges; with RDMALLOC_BACKEND=verbs in the soft-RoCE VM
//              (rdmalloc only)
// Child actions:
//   allocate   malloc/calloc/realloc/free a mix (plus the workload's own kind
//              of allocation), check the bytes and the parent's buffers
//   threads    the same from 3 threads started in the child, joined
//   exec       execve this program with --exec-child: a fresh process that
//              allocates from 2 threads and, as they start, forks 2
//              grandchildren that allocate (forks inside rdmalloc's lazy
//              set-up: first regions, class arenas); check its exit status
// A child that did all its work exits kChildOk (33); any other status fails.
//
// It catches hangs itself: a watchdog thread (no malloc, no stdio) reports a
// fork() that does not return (--fork-timeout), a worker thread stuck in one
// operation (--stall-timeout), a post-fork check that does not finish, or the
// whole run passing --deadline; it names the fork number and what the main
// thread was doing, prints every thread's name, state and wait channel (and,
// with FORK_MATRIX_GDB=1, gdb's backtraces) and exits 3. A child that does not
// exit within --child-timeout is dumped the same way, killed and reported
// (exit 4). --max-seconds is a soft budget: no new fork starts after it (the
// run still passes, with fewer forks). The last line is always
// "fork_matrix: RESULT ...":
//   RESULT ok forks=N/M seconds=S children_ok=N fork_ms=AVG/MAX child_ms=AVG/MAX ...
//   RESULT HANG fork=K forks_done=K-1 seconds=S where=...            (exit 3, 4)
//   RESULT FAIL fork=K forks_done=... seconds=S reason=...           (exit 1)
//   RESULT NA reason=...      (the workload needs rdmalloc's API)    (exit 5)
// --expect, --expect-bg and --expect-backend make a run under the wrong
// preload, MALLOC_CONF or backend fail instead of testing something else.
// --inject=FAULT puts a fault in at fork 3, for the harness's negative
// controls: fork-hang (an atfork handler that never returns), child-hang,
// worker-hang (a worker stuck in "malloc"), child-fails (exit 34),
// lost-bytes (a worker's live block corrupted).
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cinttypes>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "allocator/rdmalloc.h"  // types only: nothing of rdmalloc is linked

extern char** environ;

namespace {

// ------------------------------------------------------------ exit statuses

constexpr int kExitOk = 0;
constexpr int kExitFail = 1;
constexpr int kExitUsage = 2;
constexpr int kExitHang = 3;         // the parent hung (watchdog)
constexpr int kExitChildHang = 4;    // a child hung (killed by the watchdog)
constexpr int kExitUnavailable = 5;  // the workload needs what this allocator lacks

// A child's exit code: kChildOk only when it did all its work and every check passed.
constexpr int kChildOk = 33;
constexpr int kChildBadBytes = 34;
constexpr int kChildNoMemory = 35;
constexpr int kChildThreadFailed = 36;
constexpr int kChildLookupFailed = 37;
constexpr int kChildExecFailed = 38;
constexpr int kChildApiFailed = 39;
constexpr int kChildWrongAllocator = 40;
constexpr int kChildNotNotified = 41;
constexpr int kChildNotOurs = 42;
constexpr int kChildGrandchildFailed = 43;

const char* ChildCodeName(int code) {
  switch (code) {
    case kChildOk:
      return "ok";
    case kChildBadBytes:
      return "byte pattern mismatch";
    case kChildNoMemory:
      return "allocation returned NULL";
    case kChildThreadFailed:
      return "pthread_create/join failed";
    case kChildLookupFailed:
      return "rdmalloc_lookup failed";
    case kChildExecFailed:
      return "execve failed";
    case kChildApiFailed:
      return "mallctl/mallocx/rdmalloc_* call failed";
    case kChildWrongAllocator:
      return "exec'd program has another allocator";
    case kChildNotNotified:
      return "the inherited release observer missed a release in the child";
    case kChildGrandchildFailed:
      return "a grandchild (forked by the exec'd program as its threads start) failed";
    case kChildNotOurs:
      return "a malloc'd block is not rdmalloc heap (RDMALLOC_ENOTOURS)";
    default:
      return "unexpected exit code";
  }
}

// ------------------------------------------------------------ jemalloc and rdmalloc, by dlsym

constexpr int MallocxArena(unsigned a) { return static_cast<int>((a + 1) << 20); }
constexpr int kMallocxTcacheNone = (-1 + 2) << 8;  // MALLOCX_TCACHE_NONE
constexpr unsigned kArenasAll = 4096;              // MALLCTL_ARENAS_ALL

struct Api {
  int (*mallctl)(const char*, void*, size_t*, void*, size_t) = nullptr;
  void* (*mallocx)(size_t, int) = nullptr;
  void (*dallocx)(void*, int) = nullptr;
  decltype(&rdmalloc_alloc) alloc = nullptr;
  decltype(&rdmalloc_lookup) lookup = nullptr;
  decltype(&rdmalloc_on_release) on_release = nullptr;
  decltype(&rdmalloc_on_release_remove) on_release_remove = nullptr;
  decltype(&rdmalloc_backend) backend = nullptr;
  decltype(&rdmalloc_stats) stats = nullptr;
  const char* allocator = "glibc";  // "rdmalloc", "jemalloc" or "glibc"
};
Api api;

template <typename F>
void Find(F* fn, const char* name) {
  *fn = reinterpret_cast<F>(dlsym(RTLD_DEFAULT, name));
}

void FindApi() {
  Find(&api.mallctl, "mallctl");
  Find(&api.mallocx, "mallocx");
  Find(&api.dallocx, "dallocx");
  Find(&api.alloc, "rdmalloc_alloc");
  Find(&api.lookup, "rdmalloc_lookup");
  Find(&api.on_release, "rdmalloc_on_release");
  Find(&api.on_release_remove, "rdmalloc_on_release_remove");
  Find(&api.backend, "rdmalloc_backend");
  Find(&api.stats, "rdmalloc_stats");
  if (api.backend != nullptr && api.alloc != nullptr && api.lookup != nullptr)
    api.allocator = "rdmalloc";
  else if (api.mallctl != nullptr && api.mallocx != nullptr && api.dallocx != nullptr)
    api.allocator = "jemalloc";
}

bool MallctlBool(const char* name, bool* out) {
  size_t sz = sizeof *out;
  return api.mallctl != nullptr && api.mallctl(name, out, &sz, nullptr, 0) == 0;
}

// ------------------------------------------------------------ options

enum Workload { kPlain, kPurge, kArena, kClass, kObservers, kLookups };
const char* const kWorkloadNames[] = {"plain", "purge", "arena", "class", "observers", "lookups"};
enum ChildAction { kAllocate, kThreads, kExec };
const char* const kChildNames[] = {"allocate", "threads", "exec"};

struct Options {
  Workload workload = kPlain;
  ChildAction child = kAllocate;
  int forks = 100;
  int churn_threads = 2;
  double fork_timeout = 5;   // one fork() call, one post-fork check
  double child_timeout = 5;  // one child, start to exit
  double stall_timeout = 5;  // a worker thread's single operation
  double deadline = 60;      // the whole run: past it, the run counts as hung
  double max_seconds = 0;    // soft budget: no new fork after this (0: none)
  std::string expect;        // allocator the run must have ("" = any)
  int expect_bg = -1;        // background_thread must be 0/1 (-1: not checked)
  std::string expect_backend;
  int inject = 0;  // a fault at fork kInjectAt: the harness's negative controls
};
Options opt;

// Negative controls: each must end the run as the matching hang or failure.
enum Inject { kNoFault, kForkHang, kChildHang, kWorkerHang, kChildFails, kLostBytes };
const char* const kInjectNames[] = {"none",        "fork-hang",   "child-hang",
                                    "worker-hang", "child-fails", "lost-bytes"};
constexpr int kInjectAt = 3;

std::atomic<int> g_fork_no{0};  // the fork under way (1-based)
bool Injected(Inject what) { return opt.inject == what && g_fork_no.load() >= kInjectAt; }

[[noreturn]] void Usage(const char* why) {
  fprintf(stderr,
          "fork_matrix: %s\n"
          "usage: fork_matrix --workload=plain|purge|arena|class|observers|lookups\n"
          "         --child=allocate|threads|exec [--forks=N] [--threads=N]\n"
          "         [--fork-timeout=S] [--child-timeout=S] [--stall-timeout=S] [--deadline=S]\n"
          "         [--max-seconds=S]\n"
          "         [--expect=rdmalloc|jemalloc] [--expect-bg=0|1] [--expect-backend=NAME]\n"
          "         [--inject=fork-hang|child-hang|worker-hang|child-fails|lost-bytes]\n",
          why);
  exit(kExitUsage);
}

template <size_t N>
int Pick(const char* value, const char* const (&names)[N], const char* what) {
  for (size_t i = 0; i < N; i++)
    if (strcmp(value, names[i]) == 0) return static_cast<int>(i);
  Usage((std::string("unknown ") + what + " '" + value + "'").c_str());
}

void ParseOptions(int argc, char** argv) {
  for (int i = 1; i < argc; i++) {
    const char* a = argv[i];
    const char* eq = strchr(a, '=');
    if (strncmp(a, "--", 2) != 0 || eq == nullptr)
      Usage((std::string("bad argument ") + a).c_str());
    std::string key(a + 2, eq);
    const char* v = eq + 1;
    if (key == "workload")
      opt.workload = static_cast<Workload>(Pick(v, kWorkloadNames, "workload"));
    else if (key == "child")
      opt.child = static_cast<ChildAction>(Pick(v, kChildNames, "child action"));
    else if (key == "forks")
      opt.forks = atoi(v);
    else if (key == "threads")
      opt.churn_threads = atoi(v);
    else if (key == "fork-timeout")
      opt.fork_timeout = atof(v);
    else if (key == "child-timeout")
      opt.child_timeout = atof(v);
    else if (key == "stall-timeout")
      opt.stall_timeout = atof(v);
    else if (key == "deadline")
      opt.deadline = atof(v);
    else if (key == "max-seconds")
      opt.max_seconds = atof(v);
    else if (key == "expect")
      opt.expect = v;
    else if (key == "expect-bg")
      opt.expect_bg = atoi(v);
    else if (key == "expect-backend")
      opt.expect_backend = v;
    else if (key == "inject")
      opt.inject = Pick(v, kInjectNames, "fault");
    else
      Usage((std::string("unknown option --") + key).c_str());
  }
  if (opt.forks < 1 || opt.churn_threads < 1 || opt.churn_threads > 8)
    Usage("bad --forks/--threads");
  if (opt.fork_timeout <= 0 || opt.child_timeout <= 0 || opt.stall_timeout <= 0 ||
      opt.deadline <= 0)
    Usage("timeouts must be > 0");
}

// ------------------------------------------------------------ time, async-signal-safe output

int64_t NowNs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1000000000LL + ts.tv_nsec;
}
int64_t SecondsToNs(double s) { return static_cast<int64_t>(s * 1e9); }
int64_t g_start_ns;
double Elapsed() { return (NowNs() - g_start_ns) / 1e9; }

// A line built without malloc or stdio, for the watchdog and for children.
struct Line {
  char buf[1024];
  size_t n = 0;
  Line& operator<<(const char* s) {
    while (*s != '\0' && n < sizeof buf - 1) buf[n++] = *s++;
    return *this;
  }
  Line& operator<<(int64_t v) {
    char tmp[24];
    int k = 0;
    bool neg = v < 0;
    uint64_t u = neg ? 0 - static_cast<uint64_t>(v) : static_cast<uint64_t>(v);
    do tmp[k++] = static_cast<char>('0' + u % 10);
    while ((u /= 10) != 0);
    if (neg) tmp[k++] = '-';
    while (k > 0 && n < sizeof buf - 1) buf[n++] = tmp[--k];
    return *this;
  }
  Line& Seconds(int64_t ns) {  // "12.3"
    *this << ns / 1000000000;
    char d[3] = {'.', static_cast<char>('0' + (ns / 100000000) % 10), '\0'};
    return *this << d;
  }
  void Write(int fd = STDOUT_FILENO) {
    buf[n++] = '\n';
    for (size_t off = 0; off < n;) {
      ssize_t w = write(fd, buf + off, n - off);
      if (w <= 0 && errno != EINTR) break;
      if (w > 0) off += static_cast<size_t>(w);
    }
    n = 0;
  }
};

// Reads a small /proc file into buf (no malloc). Returns the length, 0 on failure.
size_t ReadSmall(const char* path, char* buf, size_t cap) {
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return 0;
  ssize_t r = read(fd, buf, cap - 1);
  close(fd);
  if (r <= 0) return 0;
  size_t n = static_cast<size_t>(r);
  while (n > 0 && (buf[n - 1] == '\n' || buf[n - 1] == '\0')) n--;
  buf[n] = '\0';
  return n;
}

// One line per thread of process pid: tid, name, state, kernel wait channel and
// system call, to tell a lock wait (futex) from a busy loop. No malloc, no stdio.
void DumpThreads(int64_t pid, const char* who) {
  char dir[64];
  Line path;
  path << "/proc/" << pid << "/task";
  memcpy(dir, path.buf, path.n);
  dir[path.n] = '\0';
  int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return;
  alignas(8) char ents[4096];
  for (;;) {
    long n = syscall(SYS_getdents64, fd, ents, sizeof ents);
    if (n <= 0) break;
    for (long off = 0; off < n;) {
      auto* d_reclen = reinterpret_cast<unsigned short*>(ents + off + 16);
      const char* name = ents + off + 19;
      off += *d_reclen;
      if (name[0] < '0' || name[0] > '9') continue;
      char file[96], comm[32] = "?", stat[512] = "", wchan[64] = "?", sys[128] = "?";
      auto read_field = [&](const char* what, char* out, size_t cap) {
        Line p;
        p << dir << "/" << name << "/" << what;
        memcpy(file, p.buf, p.n);
        file[p.n] = '\0';
        ReadSmall(file, out, cap);
      };
      read_field("comm", comm, sizeof comm);
      read_field("stat", stat, sizeof stat);
      read_field("wchan", wchan, sizeof wchan);
      read_field("syscall", sys, sizeof sys);
      // state: the field after "(comm) "
      const char* rp = strrchr(stat, ')');
      char state[2] = {rp != nullptr && rp[1] == ' ' ? rp[2] : '?', '\0'};
      char* sp = strchr(sys, ' ');  // "202 0x..." : keep the syscall number only
      if (sp != nullptr) *sp = '\0';
      Line l;
      l << "  " << who << " thread " << name << " '" << comm << "' state " << state << " wchan "
        << (wchan[0] != '\0' ? wchan : "0") << " syscall " << sys
        << (strcmp(sys, "202") == 0 ? " (futex)" : "");
      l.Write();
    }
  }
  close(fd);
}

// ------------------------------------------------------------ byte patterns

uint64_t Word(uint64_t seed, size_t off) {
  uint64_t x = seed ^ (off * 0x9E3779B97F4A7C15ULL);
  x ^= x >> 29;
  x *= 0xBF58476D1CE4E5B9ULL;
  return x ^ (x >> 32);
}

// A word every 64 bytes up to 64 KiB, then one every 8 pages: a live extent
// purged behind the program's back reads back as zeros and is caught, while
// the churn does not spend its time faulting in every page of 4 MiB blocks.
size_t Stride(size_t n) { return n <= 65536 ? 64 : 32768; }

// Blocks under 64 bytes are filled byte by byte; larger ones get a word every
// Stride bytes and one at the end.
void Fill(void* p, size_t n, uint64_t seed) {
  auto* b = static_cast<uint8_t*>(p);
  if (n < 64) {
    for (size_t i = 0; i < n; i++) b[i] = static_cast<uint8_t>(Word(seed, i));
    return;
  }
  for (size_t off = 0; off + 16 <= n; off += Stride(n)) {  // clear of the last word
    uint64_t w = Word(seed, off);
    memcpy(b + off, &w, 8);
  }
  uint64_t w = Word(seed, n);
  memcpy(b + n - 8, &w, 8);
}

// Checks the first `upto` bytes' share of the pattern of a block of n bytes.
bool Check(const void* p, size_t n, uint64_t seed, size_t upto = SIZE_MAX) {
  auto* b = static_cast<const uint8_t*>(p);
  if (n < 64) {
    for (size_t i = 0; i < n && i < upto; i++)
      if (b[i] != static_cast<uint8_t>(Word(seed, i))) return false;
    return true;
  }
  for (size_t off = 0; off + 16 <= n && off + 8 <= upto; off += Stride(n)) {
    uint64_t w;
    memcpy(&w, b + off, 8);
    if (w != Word(seed, off)) return false;
  }
  if (upto >= n) {
    uint64_t w;
    memcpy(&w, b + n - 8, 8);
    if (w != Word(seed, n)) return false;
  }
  return true;
}

struct Rng {
  uint64_t s;
  explicit Rng(uint64_t seed) : s(seed * 0x9E3779B97F4A7C15ULL + 1) {}
  uint64_t operator()() {
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    return s;
  }
  size_t Below(size_t n) { return static_cast<size_t>((*this)() % n); }
};

constexpr size_t kKiB = 1024, kMiB = 1024 * 1024;

// Small (8 B - 4 KiB) or large (64 KiB - max_large), large with probability pct_large%.
size_t RandomSize(Rng& rng, int pct_large, size_t max_large = 4 * kMiB) {
  if (static_cast<int>(rng.Below(100)) < pct_large)
    return 64 * kKiB + rng.Below(max_large - 64 * kKiB + 1);
  return 8 + rng.Below(4096 - 8 + 1);
}

// Access-class flags for rdmalloc_alloc (never 0: that is plain malloc).
unsigned RandomClass(Rng& rng) {
  static const unsigned kFlags[] = {
      RDMALLOC_REMOTE_READ, RDMALLOC_REMOTE_WRITE, RDMALLOC_REMOTE_READ | RDMALLOC_REMOTE_WRITE,
      RDMALLOC_REMOTE_READ | RDMALLOC_REMOTE_WRITE | RDMALLOC_REMOTE_ATOMIC};
  return kFlags[rng.Below(4)];
}

// ------------------------------------------------------------ one allocation, by kind

enum Kind { kMalloc, kClassAlloc, kArenaAlloc };

struct Block {
  void* p = nullptr;
  size_t n = 0;
  uint64_t seed = 0;
  Kind kind = kMalloc;
  unsigned arena = 0;
};

void FreeBlock(Block& b) {
  if (b.kind == kArenaAlloc)
    api.dallocx(b.p, kMallocxTcacheNone);
  else
    free(b.p);  // class memory too: rdmalloc's free knows its arena
  b.p = nullptr;
}

// ------------------------------------------------------------ the release observer

struct Observer {
  pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
  std::atomic<uint64_t> calls{0};
  std::atomic<uint64_t> bytes{0};
  void* last[8] = {};  // malloc'd records, under mu
  unsigned next = 0;
};
Observer g_observer;

void OnRelease(void* addr, size_t len, void* arg) {
  if (addr == nullptr) return;  // the last call after removal: g_observer is static
  auto* o = static_cast<Observer*>(arg);
  pthread_mutex_lock(&o->mu);
  auto* rec = static_cast<uintptr_t*>(malloc(2 * sizeof(uintptr_t)));
  if (rec != nullptr) {
    rec[0] = reinterpret_cast<uintptr_t>(addr);
    rec[1] = len;
  }
  free(o->last[o->next % 8]);
  o->last[o->next++ % 8] = rec;
  o->calls.fetch_add(1, std::memory_order_relaxed);
  o->bytes.fetch_add(len, std::memory_order_relaxed);
  pthread_mutex_unlock(&o->mu);
}

// The application's own fork hygiene for its mutex: the child is single
// threaded, so a mutex a parent thread held at fork is made new.
void ObserverAfterForkChild() { pthread_mutex_init(&g_observer.mu, nullptr); }

// A block bigger than the largest shared region (RDMALLOC_REGION_SIZE, 64 MiB
// by default) gets a region of its own: freed and purged, that region is
// released and the observers hear of it.
constexpr size_t kRegionOfItsOwn = 72u << 20;

// Frees a block with a region of its own and has jemalloc purge it; the
// release it causes is notified by the next rdmalloc_* call at the latest.
bool ReleaseOwnRegion(uint64_t seed) {
  void* p = malloc(kRegionOfItsOwn);
  if (p == nullptr) return false;
  Fill(p, kRegionOfItsOwn, seed);
  bool ok = Check(p, kRegionOfItsOwn, seed);
  free(p);
  char purge[64];
  snprintf(purge, sizeof purge, "arena.%u.purge", kArenasAll);
  return api.mallctl(purge, nullptr, nullptr, nullptr, 0) == 0 && ok;
}

// ------------------------------------------------------------ the child's work

// A child's failure, said on stderr (no stdio: the child of a threaded
// process) before it becomes the exit code the parent reports.
int Said(int code, const char* what, int64_t a = 0, int64_t b = 0) {
  Line l;
  l << "fork_matrix: child pid " << static_cast<int64_t>(getpid()) << ": " << ChildCodeName(code)
    << ": " << what << " (" << a << ", " << b << ")";
  l.Write(STDERR_FILENO);
  return code;
}

// Allocation work of a child (or of a child's thread, or of the exec'd
// program): `ops` operations over 24 slots, every block checked before free;
// blocks of 8 B - 4 KiB and a few of 64 KiB - 1 MiB (every page of those is
// faulted in: the child is meant to be quick, the parent's churn is the load).
// Returns kChildOk or the first failure's code.
int AllocWork(uint64_t seed, int ops, Workload w) {
  Rng rng(seed);
  Block slots[24];
  int rc = kChildOk;
  for (int i = 0; i < ops && rc == kChildOk; i++) {
    Block& b = slots[rng.Below(24)];
    if (b.p != nullptr) {
      if (!Check(b.p, b.n, b.seed))
        rc = Said(kChildBadBytes, "block before free: size, kind", b.n, b.kind);
      if (b.kind == kMalloc && rng.Below(4) == 0) {  // realloc keeps the bytes
        size_t n2 = RandomSize(rng, 5, kMiB);
        void* q = realloc(b.p, n2);
        if (q == nullptr) {
          rc = Said(kChildNoMemory, "realloc: size", n2);
          continue;
        }
        if (!Check(q, b.n, b.seed, n2 < b.n ? n2 : b.n))
          rc = Said(kChildBadBytes, "realloc: from, to", b.n, n2);
        b.p = q;
        b.n = n2;
        Fill(b.p, b.n, b.seed);
        continue;
      }
      FreeBlock(b);
      continue;
    }
    b.n = RandomSize(rng, 5, kMiB);
    b.seed = rng();
    b.kind = kMalloc;
    if (w == kClass && rng.Below(2) == 0) {
      b.kind = kClassAlloc;
      b.p = api.alloc(b.n, RandomClass(rng));
    } else if (rng.Below(5) == 0) {
      b.p = calloc(1, b.n);
      if (b.p != nullptr)
        for (size_t off = 0; off < b.n; off += 4096)
          if (static_cast<uint8_t*>(b.p)[off] != 0)
            rc = Said(kChildBadBytes, "calloc not zero: size, offset", b.n, off);
    } else {
      b.p = malloc(b.n);
    }
    if (b.p == nullptr) {
      rc = Said(kChildNoMemory, "allocation: size, kind", b.n, b.kind);
      continue;
    }
    Fill(b.p, b.n, b.seed);
    if (w == kLookups && rng.Below(4) == 0) {
      // The child's heap resolves; registering may be refused (the verbs
      // backend's child domains do: EOPNOTSUPP) but must not hang.
      rdmalloc_keys keys;
      int r = api.lookup(b.p, b.n, nullptr, &keys);
      if (r == RDMALLOC_ENOTOURS)
        rc = Said(kChildNotOurs, "lookup of a new block: size", b.n);
      else if (r != RDMALLOC_OK && r != RDMALLOC_EREGFAIL)
        rc = Said(kChildLookupFailed, "lookup of a new block: result, size", r, b.n);
    }
  }
  for (Block& b : slots) {
    if (b.p == nullptr) continue;
    if (rc == kChildOk && !Check(b.p, b.n, b.seed))
      rc = Said(kChildBadBytes, "block at the end: size, kind", b.n, b.kind);
    FreeBlock(b);
  }
  // The workload's own allocator calls, once.
  if (rc == kChildOk && w == kArena) {
    unsigned ind;
    size_t sz = sizeof ind;
    if (api.mallctl("arenas.create", &ind, &sz, nullptr, 0) != 0)
      return Said(kChildApiFailed, "arenas.create");
    void* p = api.mallocx(100 * kKiB, MallocxArena(ind) | kMallocxTcacheNone);
    if (p == nullptr) return Said(kChildNoMemory, "mallocx into a new arena: arena", ind);
    Fill(p, 100 * kKiB, seed);
    if (!Check(p, 100 * kKiB, seed)) rc = Said(kChildBadBytes, "mallocx block: arena", ind);
    api.dallocx(p, kMallocxTcacheNone);
    char name[64];
    snprintf(name, sizeof name, "arena.%u.destroy", ind);
    if (api.mallctl(name, nullptr, nullptr, nullptr, 0) != 0)
      rc = Said(kChildApiFailed, "arena.<i>.destroy: arena", ind);
  }
  if (rc == kChildOk && (w == kPurge || w == kObservers)) {
    char name[64];
    snprintf(name, sizeof name, "arena.%u.purge", kArenasAll);
    if (api.mallctl(name, nullptr, nullptr, nullptr, 0) != 0)
      rc = Said(kChildApiFailed, "arena.<all>.purge");
  }
  return rc;
}

// The parent's buffers, made before the first fork: the child checks its copies.
constexpr int kParentBuffers = 4;
Block g_parent_buf[kParentBuffers];

int CheckParentBuffers() {
  for (Block& b : g_parent_buf)
    if (!Check(b.p, b.n, b.seed)) return Said(kChildBadBytes, "the parent's buffer: size", b.n);
  if (opt.workload == kLookups) {
    rdmalloc_keys keys;
    int r = api.lookup(g_parent_buf[0].p, g_parent_buf[0].n, nullptr, &keys);
    if (r != RDMALLOC_OK && r != RDMALLOC_EREGFAIL)
      return Said(kChildLookupFailed, "lookup of the parent's buffer: result, size", r,
                  g_parent_buf[0].n);
  }
  return kChildOk;
}

struct ChildThread {
  pthread_t tid;
  uint64_t seed;
  int rc = kChildThreadFailed;
};

void* ChildThreadMain(void* arg) {
  auto* t = static_cast<ChildThread*>(arg);
  t->rc = AllocWork(t->seed, 100, opt.workload);
  return nullptr;
}

// A fork while the process's threads start allocating, in a fresh process:
// forks land in rdmalloc's lazy set-up (the first region, class arenas,
// domains), which a long-running parent went through before its first fork.
int ForkGrandchild(uint64_t seed) {
  pid_t pid = fork();
  if (pid == 0) {
    alarm(static_cast<unsigned>(opt.child_timeout) + 5);  // alarms are not inherited
    _exit(AllocWork(seed, 50, opt.workload));
  }
  if (pid < 0) return Said(kChildGrandchildFailed, "fork: errno", errno);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (WIFEXITED(status) && WEXITSTATUS(status) == kChildOk) return kChildOk;
  return Said(kChildGrandchildFailed, "grandchild: exit code, signal",
              WIFEXITED(status) ? WEXITSTATUS(status) : -1,
              WIFSIGNALED(status) ? WTERMSIG(status) : 0);
}

int AllocFromThreads(uint64_t seed, int nthreads, int grandchildren = 0) {
  ChildThread t[4];
  int rc = kChildOk;
  int started = 0;
  for (int i = 0; i < nthreads; i++) {
    t[i].seed = seed + i + 1;
    if (pthread_create(&t[i].tid, nullptr, ChildThreadMain, &t[i]) != 0) {
      rc = Said(kChildThreadFailed, "pthread_create: thread", i);
      break;
    }
    started++;
  }
  int own = kChildOk;
  for (int g = 0; g < grandchildren && own == kChildOk; g++) own = ForkGrandchild(seed * 31 + g);
  if (own == kChildOk) own = AllocWork(seed, 100, opt.workload);
  for (int i = 0; i < started; i++) {
    if (pthread_join(t[i].tid, nullptr) != 0)
      rc = Said(kChildThreadFailed, "pthread_join: thread", i);
    if (rc == kChildOk && t[i].rc != kChildOk) rc = t[i].rc;
  }
  if (rc == kChildOk) rc = own;
  return rc;
}

[[noreturn]] void ChildMain(int fork_no) {
  // Belt and braces: a child whose parent died in a hang still goes away
  // (alarm survives execve).
  alarm(static_cast<unsigned>(opt.child_timeout) + 5);
  uint64_t seed = 1000003ULL * static_cast<uint64_t>(fork_no);
  int rc = CheckParentBuffers();
  if (Injected(kChildHang))
    for (;;) pause();
  if (Injected(kChildFails)) rc = Said(kChildBadBytes, "injected fault: fork", fork_no);
  if (rc == kChildOk && opt.workload == kObservers && opt.child != kExec) {
    // The parent's observer, inherited, hears of a release in the child, from
    // the child's release thread (started again by its first malloc); no
    // rdmalloc call waits for it, so poll until releases_pending is 0.
    uint64_t before = g_observer.calls.load();
    struct rdmalloc_stats st;
    bool settled = false;
    bool ok = ReleaseOwnRegion(seed);
    for (int i = 0; ok && !settled && i < 1000 * opt.child_timeout; i++) {
      ok = api.stats(&st, sizeof st) == 0;
      settled = ok && st.releases_pending == 0 && g_observer.calls.load() != before;
      if (!settled) usleep(1000);
    }
    if (!ok)
      rc = Said(kChildApiFailed, "40 MiB block or rdmalloc_stats");
    else if (g_observer.calls.load() == before)
      rc = Said(kChildNotNotified, "observer calls before and after", before,
                g_observer.calls.load());
  }
  switch (opt.child) {
    case kAllocate:
      if (rc == kChildOk) rc = AllocWork(seed, 200, opt.workload);
      if (rc == kChildOk)
        FreeBlock(g_parent_buf[fork_no % kParentBuffers]);  // the parent's, in the child
      break;
    case kThreads:
      if (rc == kChildOk) rc = AllocFromThreads(seed, 3);
      break;
    case kExec: {
      if (rc != kChildOk) break;
      // Built with malloc, as a shell or a runtime builds a command line.
      std::vector<char*> args;
      args.push_back(strdup("fork_matrix"));
      args.push_back(strdup("--exec-child"));
      args.push_back(strdup(("--workload=" + std::string(kWorkloadNames[opt.workload])).c_str()));
      args.push_back(strdup(("--expect=" + std::string(api.allocator)).c_str()));
      args.push_back(strdup(("--seed=" + std::to_string(seed)).c_str()));
      args.push_back(strdup(("--child-timeout=" + std::to_string(opt.child_timeout)).c_str()));
      args.push_back(nullptr);
      execve("/proc/self/exe", args.data(), environ);
      rc = Said(kChildExecFailed, "execve /proc/self/exe: errno", errno);
      break;
    }
  }
  _exit(rc);
}

// The program exec'd by a child: a fresh process under the same preload.
int ExecChildMain(int argc, char** argv) {
  FindApi();
  Workload w = kPlain;
  uint64_t seed = 1;
  const char* expect = "";
  for (int i = 2; i < argc; i++) {
    if (strncmp(argv[i], "--workload=", 11) == 0)
      w = static_cast<Workload>(Pick(argv[i] + 11, kWorkloadNames, "workload"));
    else if (strncmp(argv[i], "--expect=", 9) == 0)
      expect = argv[i] + 9;
    else if (strncmp(argv[i], "--seed=", 7) == 0)
      seed = strtoull(argv[i] + 7, nullptr, 10);
    else if (strncmp(argv[i], "--child-timeout=", 16) == 0)
      opt.child_timeout = atof(argv[i] + 16);
  }
  if (strcmp(expect, api.allocator) != 0) return Said(kChildWrongAllocator, api.allocator);
  opt.workload = w;
  return AllocFromThreads(seed, 2, 2);
}

// ------------------------------------------------------------ the parent's worker threads

enum Op {
  kOpIdle,
  kOpMalloc,
  kOpFree,
  kOpRealloc,
  kOpCheck,
  kOpClassAlloc,
  kOpLookup,
  kOpArenasCreate,
  kOpMallocx,
  kOpDallocx,
  kOpArenaDestroy,
  kOpPurge,
  kOpDecay,
  kOpTcacheFlush,
  kOpRelease,
  kOpSleep,
  kOpDone
};
const char* const kOpNames[] = {"idle",
                                "malloc",
                                "free",
                                "realloc",
                                "check bytes",
                                "rdmalloc_alloc",
                                "rdmalloc_lookup",
                                "mallctl arenas.create",
                                "mallocx",
                                "dallocx",
                                "mallctl arena.<i>.destroy",
                                "mallctl arena.<all>.purge",
                                "mallctl arena.<all>.decay",
                                "mallctl thread.tcache.flush",
                                "malloc/free/purge of 40 MiB",
                                "sleep",
                                "done"};

struct Worker {
  char name[16] = "";
  pthread_t tid;
  std::atomic<uint64_t> ops{0};
  std::atomic<int64_t> heartbeat_ns{0};  // start of the current operation
  std::atomic<int> op{kOpIdle};
  std::atomic<bool> failed{false};
  char error[256] = "";  // written once, before failed is set
  void (*body)(Worker*) = nullptr;
  int index = 0;

  void Begin(Op o) {
    heartbeat_ns.store(NowNs(), std::memory_order_relaxed);
    op.store(o, std::memory_order_release);
  }
  void Fail(const char* fmt, ...) __attribute__((format(printf, 2, 3))) {
    if (failed.load()) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(error, sizeof error, fmt, ap);
    va_end(ap);
    failed.store(true, std::memory_order_release);
  }
};

constexpr int kMaxWorkers = 12;
Worker g_workers[kMaxWorkers];
int g_nworkers = 0;
std::atomic<bool> g_stop{false};
int g_worker_nice = 10;

void SleepMs(int ms) {
  timespec ts{ms / 1000, (ms % 1000) * 1000000L};
  nanosleep(&ts, nullptr);
}

// Byte-pattern churn: 32 slots, checked before every free; the parent's proof
// that its heap works while and after it forks.
void ChurnBody(Worker* w) {
  Rng rng(77 + w->index);
  constexpr int kSlots = 32;
  Block slots[kSlots];
  int pct_large = (opt.workload == kPurge || opt.workload == kObservers) ? 60 : 30;
  bool corrupted = false;
  while (!g_stop.load(std::memory_order_relaxed) && !w->failed.load(std::memory_order_relaxed)) {
    if (w->index == 0 && Injected(kWorkerHang)) {
      w->Begin(kOpMalloc);
      for (;;) SleepMs(1000);
    }
    if (w->index == 0 && !corrupted && Injected(kLostBytes)) {
      for (Block& b : slots)
        if (b.p != nullptr && !corrupted) {
          static_cast<uint8_t*>(b.p)[0] ^= 0xff;
          corrupted = true;
        }
    }
    Block& b = slots[rng.Below(kSlots)];
    if (b.p != nullptr) {
      w->Begin(kOpCheck);
      if (!Check(b.p, b.n, b.seed)) {
        w->Fail("%s: a live %zu-byte block at %p lost its bytes", w->name, b.n, b.p);
        break;
      }
      if (b.kind == kMalloc && rng.Below(8) == 0) {
        size_t n2 = RandomSize(rng, pct_large);
        w->Begin(kOpRealloc);
        void* q = realloc(b.p, n2);
        if (q == nullptr) {
          w->Fail("%s: realloc(%zu) returned NULL", w->name, n2);
          break;
        }
        if (!Check(q, b.n, b.seed, n2 < b.n ? n2 : b.n)) {
          w->Fail("%s: realloc from %zu to %zu bytes lost the bytes", w->name, b.n, n2);
          break;
        }
        b.p = q;
        b.n = n2;
        Fill(b.p, b.n, b.seed);
      } else {
        w->Begin(kOpFree);
        FreeBlock(b);
      }
    } else {
      b.n = RandomSize(rng, pct_large);
      b.seed = rng();
      if (opt.workload == kClass && rng.Below(2) == 0) {
        w->Begin(kOpClassAlloc);
        b.kind = kClassAlloc;
        b.p = api.alloc(b.n, RandomClass(rng));
      } else {
        w->Begin(kOpMalloc);
        b.kind = kMalloc;
        b.p = malloc(b.n);
      }
      if (b.p == nullptr) {
        w->Fail("%s: allocation of %zu bytes returned NULL", w->name, b.n);
        break;
      }
      Fill(b.p, b.n, b.seed);
      if (opt.workload == kLookups) {
        w->Begin(kOpLookup);
        rdmalloc_keys keys;
        int r = api.lookup(b.p, b.n, nullptr, &keys);
        if (r != RDMALLOC_OK) {
          w->Fail("%s: rdmalloc_lookup(%p, %zu) = %d (errno %d)", w->name, b.p, b.n, r,
                  keys.reg_errno);
          break;
        }
      }
    }
    if (rng.Below(512) == 0) {
      w->Begin(kOpTcacheFlush);
      api.mallctl("thread.tcache.flush", nullptr, nullptr, nullptr, 0);
    }
    w->ops.fetch_add(1, std::memory_order_relaxed);
  }
  for (Block& b : slots) {
    if (b.p == nullptr) continue;
    w->Begin(kOpCheck);
    if (!Check(b.p, b.n, b.seed))
      w->Fail("%s: a live %zu-byte block lost its bytes (at the end)", w->name, b.n);
    w->Begin(kOpFree);
    FreeBlock(b);
  }
}

// arena.<all>.purge and arena.<all>.decay, every few milliseconds.
void PurgeBody(Worker* w) {
  char purge[64], decay[64];
  snprintf(purge, sizeof purge, "arena.%u.purge", kArenasAll);
  snprintf(decay, sizeof decay, "arena.%u.decay", kArenasAll);
  while (!g_stop.load(std::memory_order_relaxed)) {
    w->Begin(kOpPurge);
    if (api.mallctl(purge, nullptr, nullptr, nullptr, 0) != 0) {
      w->Fail("%s: %s failed", w->name, purge);
      break;
    }
    w->Begin(kOpSleep);
    SleepMs(2);
    w->Begin(kOpDecay);
    if (api.mallctl(decay, nullptr, nullptr, nullptr, 0) != 0) {
      w->Fail("%s: %s failed", w->name, decay);
      break;
    }
    w->Begin(kOpSleep);
    SleepMs(2);
    w->ops.fetch_add(1, std::memory_order_relaxed);
  }
}

// arenas.create, mallocx into it without a thread cache, dallocx, destroy.
void ArenaBody(Worker* w) {
  Rng rng(4242);
  while (!g_stop.load(std::memory_order_relaxed)) {
    unsigned ind;
    size_t sz = sizeof ind;
    w->Begin(kOpArenasCreate);
    if (api.mallctl("arenas.create", &ind, &sz, nullptr, 0) != 0) {
      w->Fail("%s: arenas.create failed", w->name);
      break;
    }
    size_t n = RandomSize(rng, 30);
    uint64_t seed = rng();
    w->Begin(kOpMallocx);
    void* p = api.mallocx(n, MallocxArena(ind) | kMallocxTcacheNone);
    if (p == nullptr) {
      w->Fail("%s: mallocx(%zu, arena %u) returned NULL", w->name, n, ind);
      break;
    }
    Fill(p, n, seed);
    w->Begin(kOpCheck);
    if (!Check(p, n, seed)) {
      w->Fail("%s: arena %u block lost its bytes", w->name, ind);
      break;
    }
    w->Begin(kOpDallocx);
    api.dallocx(p, kMallocxTcacheNone);
    char name[64];
    snprintf(name, sizeof name, "arena.%u.destroy", ind);
    w->Begin(kOpArenaDestroy);
    if (api.mallctl(name, nullptr, nullptr, nullptr, 0) != 0) {
      w->Fail("%s: %s failed", w->name, name);
      break;
    }
    w->ops.fetch_add(1, std::memory_order_relaxed);
  }
}

// Blocks with a region of their own, freed and purged: regions are released,
// and observers called, while the main thread forks.
void ReleaserBody(Worker* w) {
  uint64_t seed = 1;
  while (!g_stop.load(std::memory_order_relaxed)) {
    w->Begin(kOpRelease);
    if (!ReleaseOwnRegion(seed++)) {
      w->Fail("%s: a 40 MiB block failed (NULL, bytes or purge)", w->name);
      break;
    }
    w->Begin(kOpSleep);
    SleepMs(5);
    w->ops.fetch_add(1, std::memory_order_relaxed);
  }
}

void* WorkerMain(void* arg) {
  auto* w = static_cast<Worker*>(arg);
  pthread_setname_np(pthread_self(), w->name);
  // Workers run at a lower priority (nice 10, this thread only): they take
  // every idle cycle, while the main thread's forks and the children, whose
  // pace sets the run's length, come first on a busy machine. A worker
  // preempted inside the allocator while the main thread forks is just the
  // situation a fork handler must survive.
  setpriority(PRIO_PROCESS, static_cast<id_t>(syscall(SYS_gettid)), g_worker_nice);
  w->body(w);
  w->Begin(kOpDone);
  return nullptr;
}

void AddWorker(const char* name, void (*body)(Worker*)) {
  Worker& w = g_workers[g_nworkers];
  w.index = g_nworkers++;
  snprintf(w.name, sizeof w.name, "%s", name);
  w.body = body;
  w.Begin(kOpIdle);
}

// ------------------------------------------------------------ the watchdog

enum Phase { kSetup, kPreFork, kForking, kWaiting, kChecking, kJoining, kFinished };
const char* const kPhaseNames[] = {"setting up",
                                   "checking the heap before fork",
                                   "in fork()",
                                   "waiting for the child",
                                   "checking the heap after fork",
                                   "stopping the worker threads",
                                   "finished"};

std::atomic<int> g_phase{kSetup};
std::atomic<int64_t> g_phase_ns{0};
std::atomic<pid_t> g_child{0};
std::atomic<bool> g_child_killed{false};
std::atomic<int64_t> g_child_killed_after_ns{0};

void SetPhase(Phase p) {
  g_phase_ns.store(NowNs(), std::memory_order_relaxed);
  g_phase.store(p, std::memory_order_release);
}

// FORK_MATRIX_GDB=1: stacks of every thread of a hung process, by gdb. Made
// ready before the first fork; run with posix_spawn, which (unlike fork) runs
// no atfork handler and does not touch malloc's locks.
const char* g_gdb_argv[12];
char g_gdb_pid_arg[24];
bool g_gdb = false;

void PrepareGdb() {
  const char* e = getenv("FORK_MATRIX_GDB");
  g_gdb = e != nullptr && strcmp(e, "1") == 0 && access("/usr/bin/gdb", X_OK) == 0;
  const char* argv[] = {
      "/usr/bin/gdb",        "-q", "-batch",      "-nx",  "-ex", "set pagination off", "-ex",
      "thread apply all bt", "-p", g_gdb_pid_arg, nullptr};
  memcpy(g_gdb_argv, argv, sizeof argv);
}

void GdbStacks(int64_t pid) {
  if (!g_gdb) return;
  Line p;
  p << pid;
  memcpy(g_gdb_pid_arg, p.buf, p.n);
  g_gdb_pid_arg[p.n] = '\0';
  pid_t gdb;
  if (posix_spawn(&gdb, g_gdb_argv[0], nullptr, nullptr, const_cast<char* const*>(g_gdb_argv),
                  environ) != 0)
    return;
  int status;
  for (int i = 0; i < 3000 && waitpid(gdb, &status, WNOHANG) == 0; i++) SleepMs(10);
  kill(gdb, SIGKILL);
  waitpid(gdb, &status, 0);
}

// The threads (and with FORK_MATRIX_GDB=1 the stacks) of pid's children, an
// exec'd child's grandchildren, which then are killed.
void DumpAndKillChildren(int64_t pid) {
  Line p;
  p << "/proc/" << pid << "/task/" << pid << "/children";
  p.buf[p.n] = '\0';
  char list[256];
  if (ReadSmall(p.buf, list, sizeof list) == 0) return;
  for (char* q = list; *q != '\0';) {
    int64_t g = 0;
    while (*q >= '0' && *q <= '9') g = g * 10 + (*q++ - '0');
    while (*q == ' ') q++;
    if (g <= 0) break;
    DumpThreads(g, "grandchild");
    GdbStacks(g);
    kill(static_cast<pid_t>(g), SIGKILL);
  }
}

// Reports a hang of the parent and exits: what got stuck (a worker, or null
// for the main thread), the main thread's phase, the fork number, every
// thread's state.
[[noreturn]] void WatchdogHang(const char* worker_what, int64_t stuck_ns) {
  int64_t f = g_fork_no.load();
  int phase = g_phase.load();
  int64_t in_phase = NowNs() - g_phase_ns.load();
  Line where;
  if (worker_what != nullptr) {
    where << worker_what << " for ";
    where.Seconds(stuck_ns) << " s; main thread ";
  } else {
    where << "main thread ";
  }
  where << kPhaseNames[phase] << " for ";
  where.Seconds(in_phase) << " s";
  where.buf[where.n] = '\0';
  Line l;
  l << "fork_matrix: HANG at fork " << f << ": " << where.buf << "; threads:";
  l.Write();
  DumpThreads(getpid(), "parent");
  pid_t c = g_child.load();
  if (c > 0) DumpThreads(c, "child");
  if (c > 0) DumpAndKillChildren(c);
  GdbStacks(getpid());
  if (c > 0) kill(c, SIGKILL);
  l << "fork_matrix: RESULT HANG fork=" << f << " forks_done=" << (f > 0 ? f - 1 : 0)
    << " seconds=";
  l.Seconds(NowNs() - g_start_ns) << " where=" << where.buf;
  l.Write();
  _exit(kExitHang);
}

void* WatchdogMain(void*) {
  pthread_setname_np(pthread_self(), "watchdog");
  sigset_t all;
  sigfillset(&all);
  pthread_sigmask(SIG_BLOCK, &all, nullptr);
  const int64_t fork_limit = SecondsToNs(opt.fork_timeout);
  const int64_t child_limit = SecondsToNs(opt.child_timeout);
  const int64_t stall_limit = SecondsToNs(opt.stall_timeout);
  const int64_t deadline = g_start_ns + SecondsToNs(opt.deadline);
  for (;;) {
    SleepMs(20);
    int64_t now = NowNs();
    int phase = g_phase.load(std::memory_order_acquire);
    int64_t in_phase = now - g_phase_ns.load(std::memory_order_relaxed);
    if (phase == kFinished) return nullptr;
    if (phase == kWaiting) {
      if (in_phase > child_limit && !g_child_killed.load()) {
        pid_t c = g_child.load();
        Line l;
        l << "fork_matrix: HANG at fork " << static_cast<int64_t>(g_fork_no.load()) << ": child "
          << static_cast<int64_t>(c) << " did not exit in ";
        l.Seconds(in_phase) << " s; its threads:";
        l.Write();
        DumpThreads(c, "child");
        GdbStacks(c);
        DumpAndKillChildren(c);
        g_child_killed_after_ns.store(in_phase);
        g_child_killed.store(true);
        kill(c, SIGKILL);
      }
    } else if (phase != kSetup && in_phase > fork_limit) {
      // A worker inside one operation for most of the main thread's phase
      // is what the main thread waits on (its check or join needs the
      // worker, its fork needs the worker's locks): blame the worker,
      // whichever limit ran out first. Most, not all: the worker may have
      // entered it just after the phase began (a negative control's
      // injected hang did, now and then, and the main thread was blamed).
      for (int i = 0; i < g_nworkers; i++) {
        Worker& w = g_workers[i];
        int op = w.op.load(std::memory_order_acquire);
        int64_t busy = now - w.heartbeat_ns.load(std::memory_order_relaxed);
        if (op == kOpDone || op == kOpIdle || 2 * busy < in_phase) continue;
        Line d;
        d << "worker " << w.name << " stuck in " << kOpNames[op];
        d.buf[d.n] = '\0';
        WatchdogHang(d.buf, busy);
      }
      WatchdogHang(nullptr, in_phase);
    }
    if (now > deadline)
      WatchdogHang("deadline passed", now - g_start_ns);  // a slow run, not a stuck one
    // Every worker must keep finishing operations (one op never takes seconds).
    if (phase != kSetup) {
      for (int i = 0; i < g_nworkers; i++) {
        Worker& w = g_workers[i];
        int op = w.op.load(std::memory_order_acquire);
        int64_t busy = now - w.heartbeat_ns.load(std::memory_order_relaxed);
        if (op != kOpDone && op != kOpIdle && busy > stall_limit) {
          Line d;
          d << "worker " << w.name << " stuck in " << kOpNames[op];
          d.buf[d.n] = '\0';
          WatchdogHang(d.buf, busy);
        }
      }
    }
  }
}

// ------------------------------------------------------------ the parent

int g_failed_fork = 0;
std::string g_failure;

void Failure(int fork_no, const std::string& why) {
  if (!g_failure.empty()) return;
  g_failed_fork = fork_no;
  g_failure = why;
}

std::string WorkerFailures() {
  for (int i = 0; i < g_nworkers; i++)
    if (g_workers[i].failed.load(std::memory_order_acquire)) return g_workers[i].error;
  return "";
}

// Keys of the parent's buffers, taken before the first fork (lookups workload).
rdmalloc_keys g_parent_keys[kParentBuffers];

// The main thread's own use of the heap around each fork; nullptr or what failed.
const char* MainHeapCheck(uint64_t seed) {
  Rng rng(seed);
  size_t n1 = RandomSize(rng, 0), n2 = RandomSize(rng, 100);
  void* a = malloc(n1);
  void* b = malloc(n2);
  if (a == nullptr || b == nullptr) return "main thread: malloc returned NULL";
  Fill(a, n1, seed);
  Fill(b, n2, seed + 1);
  bool ok = Check(a, n1, seed) && Check(b, n2, seed + 1);
  free(a);
  free(b);
  if (!ok) return "main thread: a new block lost its bytes";
  for (Block& pb : g_parent_buf)
    if (!Check(pb.p, pb.n, pb.seed))
      return "main thread: a buffer made before the forks lost its bytes";
  if (opt.workload == kLookups) {
    // Registrations made before the forks are still the parent's, unchanged.
    for (int i = 0; i < kParentBuffers; i++) {
      rdmalloc_keys k;
      if (api.lookup(g_parent_buf[i].p, g_parent_buf[i].n, nullptr, &k) != RDMALLOC_OK)
        return "main thread: rdmalloc_lookup of a buffer registered before the forks failed";
      if (k.lkey != g_parent_keys[i].lkey || k.rkey != g_parent_keys[i].rkey ||
          k.region_base != g_parent_keys[i].region_base)
        return "main thread: a buffer registered before the forks has other keys now";
    }
  }
  return nullptr;
}

int Unavailable(const std::string& why) {
  printf("fork_matrix: RESULT NA reason=%s\n", why.c_str());
  return kExitUnavailable;
}

int ParentMain() {
  FindApi();
  bool bg = false;
  bool have_bg = MallctlBool("background_thread", &bg);
  printf(
      "fork_matrix: allocator=%s backend=%s background_thread=%s MALLOC_CONF=%s workload=%s "
      "child=%s forks=%d\n",
      api.allocator, api.backend != nullptr ? api.backend() : "-",
      have_bg ? (bg ? "on" : "off") : "-",
      getenv("MALLOC_CONF") != nullptr ? getenv("MALLOC_CONF") : "", kWorkloadNames[opt.workload],
      kChildNames[opt.child], opt.forks);
  fflush(stdout);
  if (!opt.expect.empty() && opt.expect != api.allocator) {
    printf(
        "fork_matrix: RESULT FAIL fork=0 forks_done=0 seconds=0 reason=allocator is %s, expected "
        "%s (LD_PRELOAD=%s)\n",
        api.allocator, opt.expect.c_str(),
        getenv("LD_PRELOAD") != nullptr ? getenv("LD_PRELOAD") : "");
    return kExitFail;
  }
  if (opt.expect_bg >= 0 && (!have_bg || static_cast<int>(bg) != opt.expect_bg)) {
    printf(
        "fork_matrix: RESULT FAIL fork=0 forks_done=0 seconds=0 reason=background_thread is %s, "
        "expected %s\n",
        have_bg ? (bg ? "on" : "off") : "unknown", opt.expect_bg ? "on" : "off");
    return kExitFail;
  }
  bool rd = strcmp(api.allocator, "rdmalloc") == 0;
  if (api.mallctl == nullptr)
    return Unavailable(std::string("no mallctl: allocator is ") + api.allocator +
                       ", not jemalloc or rdmalloc");
  if (!rd && (opt.workload == kClass || opt.workload == kObservers || opt.workload == kLookups))
    return Unavailable(std::string("workload ") + kWorkloadNames[opt.workload] + " needs " +
                       (opt.workload == kClass       ? "rdmalloc_alloc"
                        : opt.workload == kObservers ? "rdmalloc_on_release"
                                                     : "rdmalloc_lookup") +
                       ", not found: allocator is " + api.allocator);
  if (!opt.expect_backend.empty() && (!rd || opt.expect_backend != api.backend())) {
    printf(
        "fork_matrix: RESULT FAIL fork=0 forks_done=0 seconds=0 reason=backend is %s, expected "
        "%s\n",
        rd ? api.backend() : "-", opt.expect_backend.c_str());
    return kExitFail;
  }

  g_start_ns = NowNs();
  SetPhase(kSetup);
  PrepareGdb();
  if (opt.inject == kForkHang)
    pthread_atfork(
        [] {
          if (Injected(kForkHang))
            for (;;) pause();
        },
        nullptr, nullptr);
  if (opt.workload == kObservers) {
    pthread_atfork(nullptr, nullptr, ObserverAfterForkChild);
    if (api.on_release(OnRelease, &g_observer) != 0) {
      printf(
          "fork_matrix: RESULT FAIL fork=0 forks_done=0 seconds=0 reason=rdmalloc_on_release "
          "failed\n");
      return kExitFail;
    }
  }
  // The parent's buffers: one small, one 64 KiB, one 1 MiB, one 3 MiB.
  const size_t sizes[kParentBuffers] = {200, 64 * kKiB, kMiB, 3 * kMiB};
  for (int i = 0; i < kParentBuffers; i++) {
    Block& b = g_parent_buf[i];
    b.n = sizes[i];
    b.seed = 555 + i;
    b.p = malloc(b.n);
    Fill(b.p, b.n, b.seed);
    if (opt.workload == kLookups &&
        api.lookup(b.p, b.n, nullptr, &g_parent_keys[i]) != RDMALLOC_OK) {
      printf(
          "fork_matrix: RESULT FAIL fork=0 forks_done=0 seconds=0 reason=rdmalloc_lookup of a "
          "parent buffer failed\n");
      return kExitFail;
    }
  }
  if (opt.workload == kLookups) {
    struct rdmalloc_stats st;
    if (api.stats(&st, sizeof st) != 0 || st.bytes_registered == 0) {
      printf(
          "fork_matrix: RESULT FAIL fork=0 forks_done=0 seconds=0 reason=nothing registered after "
          "the lookups\n");
      return kExitFail;
    }
    printf("fork_matrix: %" PRIu64 " MiB registered (%s) before the first fork\n",
           st.bytes_registered >> 20, api.backend());
  }
  char name[16];
  for (int i = 0; i < opt.churn_threads; i++) {
    snprintf(name, sizeof name, "churn%d", i);
    AddWorker(name, ChurnBody);
  }
  if (opt.workload == kPurge || opt.workload == kObservers || opt.workload == kLookups)
    AddWorker("purger", PurgeBody);
  if (opt.workload == kArena) AddWorker("arenas", ArenaBody);
  if (opt.workload == kObservers) AddWorker("releaser", ReleaserBody);

  pthread_t watchdog;
  if (pthread_create(&watchdog, nullptr, WatchdogMain, nullptr) != 0) {
    printf(
        "fork_matrix: RESULT FAIL fork=0 forks_done=0 seconds=0 reason=cannot start the "
        "watchdog\n");
    return kExitFail;
  }
  for (int i = 0; i < g_nworkers; i++) {
    if (pthread_create(&g_workers[i].tid, nullptr, WorkerMain, &g_workers[i]) != 0) {
      printf(
          "fork_matrix: RESULT FAIL fork=0 forks_done=0 seconds=0 reason=cannot start worker "
          "threads\n");
      return kExitFail;
    }
  }
  SleepMs(20);  // let the workers get going

  int forks_done = 0;
  uint64_t child_ok = 0;
  int64_t fork_ns = 0, wait_ns = 0;          // in fork(), waiting for children
  int64_t fork_max_ns = 0, wait_max_ns = 0;  // the longest of each: headroom to the timeouts
  bool budget_spent = false;
  for (int f = 1; f <= opt.forks && g_failure.empty(); f++) {
    if (opt.max_seconds > 0 && Elapsed() > opt.max_seconds) {
      budget_spent = true;
      break;
    }
    g_fork_no.store(f);
    SetPhase(kPreFork);
    if (const char* e = MainHeapCheck(f)) {
      Failure(f, std::string(e) + " (before fork)");
      break;
    }
    SetPhase(kForking);
    int64_t t0 = NowNs();
    pid_t pid = fork();
    if (pid == 0) ChildMain(f);
    int64_t t1 = NowNs();
    fork_ns += t1 - t0;
    if (t1 - t0 > fork_max_ns) fork_max_ns = t1 - t0;
    if (pid < 0) {
      Failure(f, std::string("fork failed: ") + strerror(errno));
      break;
    }
    g_child.store(pid);
    SetPhase(kWaiting);
    int status = 0;
    pid_t r;
    while ((r = waitpid(pid, &status, 0)) < 0 && errno == EINTR) {
    }
    SetPhase(kChecking);
    int64_t t2 = NowNs();
    wait_ns += t2 - t1;
    if (t2 - t1 > wait_max_ns) wait_max_ns = t2 - t1;
    g_child.store(0);
    if (g_child_killed.load()) {
      printf(
          "fork_matrix: RESULT HANG fork=%d forks_done=%d seconds=%.1f where=child did not exit in "
          "%.1f s (killed)\n",
          f, f - 1, Elapsed(), g_child_killed_after_ns.load() / 1e9);
      fflush(stdout);
      SetPhase(kFinished);
      _exit(kExitChildHang);  // the workers may be stuck too: do not join them
    }
    if (r != pid) {
      Failure(f, std::string("waitpid failed: ") + strerror(errno));
      break;
    }
    if (WIFSIGNALED(status)) {
      Failure(f, std::string("child killed by signal ") + strsignal(WTERMSIG(status)));
      break;
    }
    int code = WEXITSTATUS(status);
    if (code != kChildOk) {
      Failure(f, "child exit code " + std::to_string(code) + " (" + ChildCodeName(code) + ")");
      break;
    }
    child_ok++;
    std::string wf = WorkerFailures();
    if (!wf.empty()) {
      Failure(f, wf);
      break;
    }
    if (const char* e = MainHeapCheck(f * 7 + 1)) {
      Failure(f, std::string(e) + " (after fork)");
      break;
    }
    forks_done = f;
  }

  // Every worker finishes at least one more operation after the last fork
  // (the watchdog times out a stuck one), then they stop and free their blocks.
  if (g_failure.empty()) {
    uint64_t seen[kMaxWorkers];
    for (int i = 0; i < g_nworkers; i++) seen[i] = g_workers[i].ops.load();
    SetPhase(kChecking);
    for (int i = 0; i < g_nworkers; i++)
      while (g_workers[i].ops.load() == seen[i] && !g_workers[i].failed.load()) SleepMs(1);
  }
  g_stop.store(true);
  SetPhase(kJoining);
  uint64_t total_ops = 0;
  for (int i = 0; i < g_nworkers; i++) {
    pthread_join(g_workers[i].tid, nullptr);
    total_ops += g_workers[i].ops.load();
  }
  std::string wf = WorkerFailures();
  if (!wf.empty()) Failure(forks_done + 1, wf);
  if (opt.workload == kObservers) {
    struct rdmalloc_stats st;  // the releases queued so far are notified
    api.stats(&st, sizeof st);
    if (g_observer.calls.load() == 0)
      Failure(forks_done + 1, "the release observer was never called");
    if (api.on_release_remove(OnRelease, &g_observer) != 0)
      Failure(forks_done + 1, "rdmalloc_on_release_remove failed");
  }
  for (Block& b : g_parent_buf) {
    if (g_failure.empty() && !Check(b.p, b.n, b.seed))
      Failure(forks_done + 1, "a parent buffer lost its bytes");
    free(b.p);
  }
  SetPhase(kFinished);
  pthread_join(watchdog, nullptr);

  std::string extra;
  if (opt.workload == kObservers) {
    extra = " releases_notified=" + std::to_string(g_observer.calls.load()) + " (" +
            std::to_string(g_observer.bytes.load() >> 20) + " MiB)";
    for (void* p : g_observer.last) free(p);
  }
  if (!g_failure.empty()) {
    printf("fork_matrix: RESULT FAIL fork=%d forks_done=%d seconds=%.1f reason=%s\n", g_failed_fork,
           forks_done, Elapsed(), g_failure.c_str());
    return kExitFail;
  }
  int div = forks_done > 0 ? forks_done : 1;
  printf("fork_matrix: RESULT ok forks=%d/%d seconds=%.1f children_ok=%" PRIu64
         " fork_ms=%.1f/%.1f child_ms=%.1f/%.1f worker_ops=%" PRIu64 "%s%s\n",
         forks_done, opt.forks, Elapsed(), child_ok, fork_ns / 1e6 / div, fork_max_ns / 1e6,
         wait_ns / 1e6 / div, wait_max_ns / 1e6, total_ops, extra.c_str(),
         budget_spent ? " stopped=time budget" : "");
  return kExitOk;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc >= 2 && strcmp(argv[1], "--exec-child") == 0) return ExecChildMain(argc, argv);
  setvbuf(stdout, nullptr, _IOLBF, 0);
  ParseOptions(argc, argv);
  return ParentMain();
}
