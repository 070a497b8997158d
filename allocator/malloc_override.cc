// rdmalloc's start-up, the malloc family's entry points that are not
// jemalloc's own, and the access classes' allocation entry points.
//
// malloc, calloc, realloc, free, new, delete, mallocx, dallocx and sdallocx
// are jemalloc's functions themselves (third_party/jemalloc_entry_points.txt):
// a wrapper's extra call cost small-block programs a few percent. What a
// wrapper did moved onto jemalloc's slow paths (third_party/
// jemalloc_rdmalloc.patch): an allocation there starts rdmalloc (rdmj_start)
// if it has not started, and every free asks rdmj_access_class() once access
// classes exist and frees class memory past the thread caches (a cached class
// block would be handed to a plain malloc, putting unrelated data where a
// peer may read or write it); realloc hands a class block to
// rdmj_class_realloc(). rallocx, the aligned family and mallctl keep
// wrappers here: glibc's answers, class memory staying in its class, the
// control guard.
#include <dlfcn.h>
#include <errno.h>
#include <jemalloc/jemalloc.h>
#include <pthread.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>

#include "allocator/arena_control.h"
#include "allocator/config.h"
#include "allocator/extent_hooks.h"
#include "allocator/fork.h"
#include "allocator/futex.h"
#include "allocator/heap.h"
#include "allocator/init.h"
#include "allocator/jemalloc_api.h"
#include "allocator/startup_data.h"

extern char** environ;

namespace rdmalloc {
namespace {

RDMALLOC_STARTUP_DATA pthread_t g_init_thread;

void WarnLine(const char* line) {
  char buf[700];
  size_t n = strlen(line);
  if (n > sizeof buf - 1) n = sizeof buf - 1;
  memcpy(buf, line, n);
  buf[n] = '\n';
  ssize_t ignored = write(STDERR_FILENO, buf, n + 1);
  (void)ignored;
}

// The first stage of the fork protocol: a fork waits for a start-up under way
// in another thread (it calls jemalloc); the child restarts at its next call.
void WaitForInitialisation();
void ForkChildRestart();

void Initialise() {
  ForkHandlers init;
  init.prepare = WaitForInitialisation;
  init.child = ForkChildRestart;
  SetForkHandlers(LockRank::kInit, init);
  Config config = ParseEnvironment(environ, WarnLine);
  WarnUnknownVariables(environ, WarnLine);
  TheHeap().Configure(config);
  InstallExtentHooks();
  if (config.decay_ms != kDecayUnset) SetDirtyDecay(config.decay_ms);
  NoteJemallocDecay(config.decay_ms);
  TheHeap().Start();
}

}  // namespace

RDMALLOC_STARTUP_DATA std::atomic<int> g_init_state{kUninitialised};

namespace {

// Threads that find a start under way in another thread sleep on the state
// word until the starter wakes them. A start can take long (with
// RDMALLOC_REGISTER=eager it opens the backend and registers the first
// regions), and threads that only yielded took the CPU it needed.
RDMALLOC_STARTUP_DATA std::atomic<int> g_start_waiters{0};

// Sequentially consistent with the starter's store of the new state and its
// load of g_start_waiters: either this sees the start done, or the starter
// sees a waiter and wakes it (a wake before the wait finds the word changed).
void WaitWhileStarting() {
  while (g_init_state.load() == kInitialising) {
    g_start_waiters.fetch_add(1);
    if (g_init_state.load() == kInitialising) FutexWait(&g_init_state, int{kInitialising});
    g_start_waiters.fetch_sub(1);
  }
}

void FinishStart() {
  g_init_state.store(kReady);
  if (g_start_waiters.load() != 0) FutexWakeAll(&g_init_state);
}

// A fork waits for a start under way, unless its own thread is starting.
void WaitForInitialisation() {
  if (!pthread_equal(g_init_thread, pthread_self())) WaitWhileStarting();
}

// The child's next allocation must reach rdmj_start: while the state is not
// ready, every fast path is off (an allocation that finds a thread cache's
// block would not reach it). Its one thread waits for nothing.
void ForkChildRestart() {
  if (g_init_state.load(std::memory_order_relaxed) != kReady) return;
  g_start_waiters.store(0, std::memory_order_relaxed);
  g_init_state.store(kForked, std::memory_order_release);
  rdmj_recompute_fast_paths();
}

}  // namespace

void EnsureInitialisedSlow() {
  int s = g_init_state.load(std::memory_order_acquire);
  if (s == kReady) return;
  // Allocations made while we initialise (pthread_atfork, backend objects)
  // go straight to jemalloc, whose hooks are ours by then.
  if (s == kInitialising && pthread_equal(g_init_thread, pthread_self())) return;
  int expected = s == kForked ? kForked : kUninitialised;
  if (g_init_state.compare_exchange_strong(expected, kInitialising)) {
    g_init_thread = pthread_self();
    if (s == kForked) TheHeap().EnsureReleaseThread();
    else Initialise();
    FinishStart();
    // Every thread was kept on jemalloc's slow paths until now.
    rdmj_recompute_fast_paths();
    return;
  }
  // Another thread won: its start is under way (the state never returns to
  // what the exchange expected), or done.
  WaitWhileStarting();
}

}  // namespace rdmalloc

#define RDMALLOC_EXPORT extern "C" __attribute__((visibility("default")))

using rdmalloc::EnsureInitialised;

// jemalloc's allocation slow path, while rdmalloc is not ready: start it, or
// restart a fork child, but not from inside jemalloc (an allocation made in an
// extent hook): the restart starts a thread. The next allocation restarts.
extern "C" void rdmj_start() {
  if (rdmalloc::g_init_state.load(std::memory_order_acquire) == rdmalloc::kForked &&
      rdmj_in_jemalloc())
    return;
  rdmalloc::EnsureInitialisedSlow();
}

extern "C" unsigned rdmj_access_class(const void* p) {
  return p == nullptr ? 0 : rdmalloc::TheHeap().AccessClassOf(p);
}

namespace {

// The access class of a block being resized; 0 (plain) for everything while
// no class arena exists, at the cost of one load.
inline unsigned ClassOf(const void* p) {
  rdmalloc::witness::CallingJemalloc();
  if (__builtin_expect(!rdmalloc::g_classes_in_use.load(std::memory_order_relaxed), 1) ||
      p == nullptr)
    return 0;
  return rdmalloc::TheHeap().AccessClassOf(p);
}

constexpr unsigned kKnownClassFlags = RDMALLOC_REMOTE_READ | RDMALLOC_REMOTE_WRITE |
                                      RDMALLOC_REMOTE_ATOMIC;

// MALLOCX_TCACHE's and MALLOCX_ARENA's fields in mallocx flags.
constexpr int kTcacheBits = 0xfff << 8;
constexpr int kArenaBits = ~((1 << 20) - 1);

// mallocx flags serving access class c, or -1 (errno set) if its arena cannot be had.
int ClassFlags(unsigned c) {
  unsigned arena = rdmalloc::ClassArena(c);
  if (arena == 0) {
    errno = ENOMEM;
    return -1;
  }
  return MALLOCX_ARENA(arena) | MALLOCX_TCACHE_NONE;
}

}  // namespace

#ifdef RDMALLOC_WITNESS
// Witness builds check every entry into jemalloc: its caller holds no lock
// ranked above jemalloc's. These wrappers override the weak aliases that
// import_jemalloc.sh gives jemalloc's own functions.
#define RDMALLOC_WITNESSED(result, signature, call)                          \
  __attribute__((visibility("default"))) result signature {                 \
    rdmalloc::witness::CallingJemalloc();                                    \
    return call;                                                             \
  }
extern "C" {
RDMALLOC_WITNESSED(void*, malloc(size_t n), rdmj_malloc(n))
RDMALLOC_WITNESSED(void*, calloc(size_t n, size_t size), rdmj_calloc(n, size))
RDMALLOC_WITNESSED(void, free(void* p), rdmj_free(p))
RDMALLOC_WITNESSED(void*, realloc(void* p, size_t n), rdmj_realloc(p, n))
RDMALLOC_WITNESSED(void*, mallocx(size_t n, int flags), rdmj_mallocx(n, flags))
RDMALLOC_WITNESSED(void, dallocx(void* p, int flags), rdmj_dallocx(p, flags))
RDMALLOC_WITNESSED(void, sdallocx(void* p, size_t n, int flags), rdmj_sdallocx(p, n, flags))
}
// This copy's malloc: taking &malloc would give whichever malloc the
// process bound, since malloc is exported and preemptible.
extern "C" void* rdmalloc_own_malloc(size_t)
    __attribute__((alias("malloc"), copy(malloc), visibility("hidden")));
#else
// This copy's malloc, jemalloc's under its own name: &malloc would give
// whichever malloc the process bound, since malloc is exported and preemptible.
extern "C" void* rdmalloc_own_malloc(size_t) __asm__("rdmj_malloc");
#endif

namespace rdmalloc {
namespace {

void IgnoreLine(const char*) {}

// With RDMALLOC_VERBOSE, one line when another malloc already serves the
// process (rdmalloc dlopen'ed late, or linked behind another malloc): only
// memory asked of this copy by handle is then rdmalloc's. At load time,
// because dlsym and dladdr take the loader lock: this thread holds it already
// here, while at the first malloc another thread could hold it and wait for us.
__attribute__((constructor)) void NoteAnotherMalloc() {
  if (ParseEnvironment(environ, IgnoreLine).verbose == 0) return;
  void* process_malloc = dlsym(RTLD_DEFAULT, "malloc");
  void* process_free = dlsym(RTLD_DEFAULT, "free");
  if (process_malloc == nullptr || process_free == nullptr ||
      process_malloc == reinterpret_cast<void*>(&rdmalloc_own_malloc))
    return;
  // A non-PIE program that takes malloc's address makes dlsym answer with the
  // program's own PLT entry, whoever serves it: ask the function instead.
  void* probe = reinterpret_cast<void* (*)(size_t)>(process_malloc)(1);
  bool ours = probe != nullptr && TheHeap().RegionOf(probe, 1) != nullptr;
  reinterpret_cast<void (*)(void*)>(process_free)(probe);
  if (ours) return;
  Dl_info winner, self;
  const char* winner_name =
      dladdr(process_malloc, &winner) && winner.dli_fname ? winner.dli_fname : "?";
  const char* self_name = dladdr(reinterpret_cast<void*>(&rdmalloc_own_malloc), &self) &&
                                  self.dli_fname
                              ? self.dli_fname
                              : "?";
  char line[600];
  snprintf(line, sizeof line,
           "rdmalloc[%d]: %s: another malloc serves the process (%s); only what this copy "
           "allocates when called by handle is registered (docs/EMBEDDING.md)",
           static_cast<int>(getpid()), self_name, winner_name);
  WarnLine(line);
}

}  // namespace
}  // namespace rdmalloc

// realloc of a class block, which stays in its class: jemalloc's realloc asks
// rdmj_access_class() first and leaves it here with the answer
// (jemalloc_rdmalloc.patch). size 0 frees, as glibc's realloc does.
extern "C" void* rdmj_class_realloc(void* p, size_t size, unsigned access_class) {
  if (size == 0) {
    rdmj_dallocx(p, MALLOCX_TCACHE_NONE);
    return nullptr;
  }
  int flags = ClassFlags(access_class);
  if (flags < 0) return nullptr;
  void* q = rdmj_rallocx(p, size, flags);
  if (q == nullptr) errno = ENOMEM;
  return q;
}

RDMALLOC_EXPORT void* rdmalloc_alloc(size_t size, unsigned flags) {
  EnsureInitialised();
  if ((flags & ~kKnownClassFlags) != 0) {
    errno = EINVAL;
    return nullptr;
  }
  if (flags == 0) return rdmj_malloc(size);
  int mflags = ClassFlags(flags);
  if (mflags < 0) return nullptr;
  void* p = rdmj_mallocx(size == 0 ? 1 : size, mflags);
  if (p == nullptr) errno = ENOMEM;
  return p;
}
RDMALLOC_EXPORT void* rdmalloc_aligned_alloc(size_t alignment, size_t size, unsigned flags) {
  EnsureInitialised();
  if ((flags & ~kKnownClassFlags) != 0 || alignment == 0 || (alignment & (alignment - 1)) != 0) {
    errno = EINVAL;
    return nullptr;
  }
  if (flags == 0) return rdmj_aligned_alloc(alignment, size);
  int mflags = ClassFlags(flags);
  if (mflags < 0) return nullptr;
  void* p = rdmj_mallocx(size == 0 ? 1 : size, mflags | MALLOCX_ALIGN(alignment));
  if (p == nullptr) errno = ENOMEM;
  return p;
}

// glibc 2.36's memalign, aligned_alloc, valloc and pvalloc, which programs
// rely on (jemalloc refuses the first two cases and leaves errno alone):
// - an alignment that is not a power of two is rounded up to the next one,
//   and 0 asks for none;
// - one above SIZE_MAX / 2 + 1 has no power of two to round to: EINVAL;
// - out of memory, a size or alignment too large included: ENOMEM.
namespace {

// The alignment glibc would use, or 0 (errno EINVAL) if there is none.
size_t GlibcAlignment(size_t alignment) {
  if (alignment > SIZE_MAX / 2 + 1) {
    errno = EINVAL;
    return 0;
  }
  if (alignment <= 1) return 1;
  if ((alignment & (alignment - 1)) == 0) return alignment;
  return size_t{1} << (8 * sizeof(size_t) - __builtin_clzl(alignment));
}

void* OrEnomem(void* p) {
  if (p == nullptr) errno = ENOMEM;
  return p;
}

}  // namespace

// jemalloc's posix_memalign answers as glibc's does (EINVAL for an alignment
// that is not a power-of-two multiple of sizeof(void*), *p untouched on
// failure) but for errno, which glibc's sets to ENOMEM when memory runs out.
RDMALLOC_EXPORT int posix_memalign(void** p, size_t alignment, size_t size) {
  EnsureInitialised();
  int err = rdmj_posix_memalign(p, alignment, size);
  if (err == ENOMEM) errno = ENOMEM;
  return err;
}
RDMALLOC_EXPORT void* aligned_alloc(size_t alignment, size_t size) {
  EnsureInitialised();
  alignment = GlibcAlignment(alignment);
  if (alignment == 0) return nullptr;
  return OrEnomem(rdmj_aligned_alloc(alignment, size));
}
RDMALLOC_EXPORT void* memalign(size_t alignment, size_t size) {
  EnsureInitialised();
  alignment = GlibcAlignment(alignment);
  if (alignment == 0) return nullptr;
  // jemalloc's memalign and valloc ignore the alignment for size 0.
  return OrEnomem(rdmj_memalign(alignment, size == 0 ? 1 : size));
}
RDMALLOC_EXPORT void* valloc(size_t size) {
  EnsureInitialised();
  return OrEnomem(rdmj_valloc(size == 0 ? 1 : size));
}
// jemalloc 5.3 has no pvalloc; glibc's would hand out glibc heap memory.
RDMALLOC_EXPORT void* pvalloc(size_t size) {
  EnsureInitialised();
  long page = sysconf(_SC_PAGESIZE);
  size_t rounded = (size + page - 1) & ~static_cast<size_t>(page - 1);
  if (rounded < size) {
    errno = ENOMEM;
    return nullptr;
  }
  return OrEnomem(rdmj_memalign(page, rounded == 0 ? page : rounded));
}
RDMALLOC_EXPORT void* rallocx(void* p, size_t size, int flags) {
  EnsureInitialised();
  if (unsigned c = ClassOf(p)) {
    int class_flags = ClassFlags(c);  // its arena, no thread cache
    if (class_flags < 0) return nullptr;
    flags = (flags & ~(kArenaBits | kTcacheBits)) | class_flags;
  }
  return rdmj_rallocx(p, size, flags);
}
// Every control path goes through the guard (allocator/arena_control.h).
RDMALLOC_EXPORT int mallctl(const char* name, void* oldp, size_t* oldlenp, void* newp,
                            size_t newlen) {
  EnsureInitialised();
  return rdmalloc::ControlMallctl(name, oldp, oldlenp, newp, newlen);
}
RDMALLOC_EXPORT int mallctlnametomib(const char* name, size_t* mibp, size_t* miblenp) {
  EnsureInitialised();
  return rdmj_mallctlnametomib(name, mibp, miblenp);
}
RDMALLOC_EXPORT int mallctlbymib(const size_t* mib, size_t miblen, void* oldp, size_t* oldlenp,
                                 void* newp, size_t newlen) {
  EnsureInitialised();
  return rdmalloc::ControlMallctlByMib(mib, miblen, oldp, oldlenp, newp, newlen);
}

#ifdef RDMALLOC_WITNESS
// C++ new and delete, checked like malloc and free in witness builds.
extern "C" {
void* rdmj__Znwm(size_t);
void* rdmj__Znam(size_t);
void* rdmj__ZnwmRKSt9nothrow_t(size_t, const std::nothrow_t&) noexcept;
void* rdmj__ZnamRKSt9nothrow_t(size_t, const std::nothrow_t&) noexcept;
void* rdmj__ZnwmSt11align_val_t(size_t, std::align_val_t);
void* rdmj__ZnamSt11align_val_t(size_t, std::align_val_t);
void* rdmj__ZnwmSt11align_val_tRKSt9nothrow_t(size_t, std::align_val_t,
                                               const std::nothrow_t&) noexcept;
void* rdmj__ZnamSt11align_val_tRKSt9nothrow_t(size_t, std::align_val_t,
                                               const std::nothrow_t&) noexcept;
void rdmj__ZdlPv(void*) noexcept;
void rdmj__ZdaPv(void*) noexcept;
void rdmj__ZdlPvm(void*, size_t) noexcept;
void rdmj__ZdaPvm(void*, size_t) noexcept;
void rdmj__ZdlPvRKSt9nothrow_t(void*, const std::nothrow_t&) noexcept;
void rdmj__ZdaPvRKSt9nothrow_t(void*, const std::nothrow_t&) noexcept;
void rdmj__ZdlPvSt11align_val_t(void*, std::align_val_t) noexcept;
void rdmj__ZdaPvSt11align_val_t(void*, std::align_val_t) noexcept;
void rdmj__ZdlPvmSt11align_val_t(void*, size_t, std::align_val_t) noexcept;
void rdmj__ZdaPvmSt11align_val_t(void*, size_t, std::align_val_t) noexcept;
void rdmj__ZdlPvSt11align_val_tRKSt9nothrow_t(void*, std::align_val_t,
                                              const std::nothrow_t&) noexcept;
void rdmj__ZdaPvSt11align_val_tRKSt9nothrow_t(void*, std::align_val_t,
                                              const std::nothrow_t&) noexcept;
}
using std::align_val_t;
using std::nothrow_t;
RDMALLOC_WITNESSED(void*, operator new(size_t n), rdmj__Znwm(n))
RDMALLOC_WITNESSED(void*, operator new[](size_t n), rdmj__Znam(n))
RDMALLOC_WITNESSED(void*, operator new(size_t n, const nothrow_t& t) noexcept,
                   rdmj__ZnwmRKSt9nothrow_t(n, t))
RDMALLOC_WITNESSED(void*, operator new[](size_t n, const nothrow_t& t) noexcept,
                   rdmj__ZnamRKSt9nothrow_t(n, t))
RDMALLOC_WITNESSED(void*, operator new(size_t n, align_val_t a), rdmj__ZnwmSt11align_val_t(n, a))
RDMALLOC_WITNESSED(void*, operator new[](size_t n, align_val_t a),
                   rdmj__ZnamSt11align_val_t(n, a))
RDMALLOC_WITNESSED(void*, operator new(size_t n, align_val_t a, const nothrow_t& t) noexcept,
                   rdmj__ZnwmSt11align_val_tRKSt9nothrow_t(n, a, t))
RDMALLOC_WITNESSED(void*, operator new[](size_t n, align_val_t a, const nothrow_t& t) noexcept,
                   rdmj__ZnamSt11align_val_tRKSt9nothrow_t(n, a, t))
RDMALLOC_WITNESSED(void, operator delete(void* p) noexcept, rdmj__ZdlPv(p))
RDMALLOC_WITNESSED(void, operator delete[](void* p) noexcept, rdmj__ZdaPv(p))
RDMALLOC_WITNESSED(void, operator delete(void* p, size_t n) noexcept, rdmj__ZdlPvm(p, n))
RDMALLOC_WITNESSED(void, operator delete[](void* p, size_t n) noexcept, rdmj__ZdaPvm(p, n))
RDMALLOC_WITNESSED(void, operator delete(void* p, const nothrow_t& t) noexcept,
                   rdmj__ZdlPvRKSt9nothrow_t(p, t))
RDMALLOC_WITNESSED(void, operator delete[](void* p, const nothrow_t& t) noexcept,
                   rdmj__ZdaPvRKSt9nothrow_t(p, t))
RDMALLOC_WITNESSED(void, operator delete(void* p, align_val_t a) noexcept,
                   rdmj__ZdlPvSt11align_val_t(p, a))
RDMALLOC_WITNESSED(void, operator delete[](void* p, align_val_t a) noexcept,
                   rdmj__ZdaPvSt11align_val_t(p, a))
RDMALLOC_WITNESSED(void, operator delete(void* p, size_t n, align_val_t a) noexcept,
                   rdmj__ZdlPvmSt11align_val_t(p, n, a))
RDMALLOC_WITNESSED(void, operator delete[](void* p, size_t n, align_val_t a) noexcept,
                   rdmj__ZdaPvmSt11align_val_t(p, n, a))
RDMALLOC_WITNESSED(void, operator delete(void* p, align_val_t a, const nothrow_t& t) noexcept,
                   rdmj__ZdlPvSt11align_val_tRKSt9nothrow_t(p, a, t))
RDMALLOC_WITNESSED(void, operator delete[](void* p, align_val_t a, const nothrow_t& t) noexcept,
                   rdmj__ZdaPvSt11align_val_tRKSt9nothrow_t(p, a, t))
#undef RDMALLOC_WITNESSED
#endif  // RDMALLOC_WITNESS
