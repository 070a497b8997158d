// The malloc family, C++ new, and jemalloc's mallctl: thin wrappers that make
// sure rdmalloc's hooks are installed before jemalloc serves the first byte,
// then tail-call jemalloc. Frees go straight to jemalloc (nothing to free
// before the first allocation).
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <new>

#include "allocator/config.h"
#include "allocator/extent_hooks.h"
#include "allocator/heap.h"
#include "allocator/init.h"
#include "allocator/jemalloc_api.h"

extern char** environ;

namespace rdmalloc {
namespace {

pthread_t g_init_thread;

void WarnLine(const char* line) {
  char buf[700];
  size_t n = strlen(line);
  if (n > sizeof buf - 1) n = sizeof buf - 1;
  memcpy(buf, line, n);
  buf[n] = '\n';
  ssize_t ignored = write(STDERR_FILENO, buf, n + 1);
  (void)ignored;
}

const char* GetEnv(const char* name) { return getenv(name); }

void PrepareFork() { TheHeap().PrepareFork(); }
void ParentAfterFork() { TheHeap().ParentAfterFork(); }
void ChildAfterFork() { TheHeap().ChildAfterFork(); }

void Initialise() {
  Config config = ParseConfig(GetEnv, WarnLine);
  WarnUnknownVariables(environ, WarnLine);
  TheHeap().Configure(config);
  InstallExtentHooks();
  if (config.decay_ms != kDecayUnset) SetDirtyDecay(config.decay_ms);
  TheHeap().Start();
  pthread_atfork(PrepareFork, ParentAfterFork, ChildAfterFork);
}

}  // namespace

std::atomic<int> g_init_state{kUninitialised};

void EnsureInitialisedSlow() {
  int s = g_init_state.load(std::memory_order_acquire);
  if (s == kReady) return;
  // Allocations made while we initialise (pthread_atfork, backend objects)
  // go straight to jemalloc, whose hooks are ours by then.
  if (s == kInitialising && pthread_equal(g_init_thread, pthread_self())) return;
  int expected = kUninitialised;
  if (g_init_state.compare_exchange_strong(expected, kInitialising)) {
    g_init_thread = pthread_self();
    Initialise();
    g_init_state.store(kReady, std::memory_order_release);
    return;
  }
  while (g_init_state.load(std::memory_order_acquire) != kReady) sched_yield();
}

}  // namespace rdmalloc

#define RDMALLOC_EXPORT extern "C" __attribute__((visibility("default")))

using rdmalloc::EnsureInitialised;

RDMALLOC_EXPORT void* malloc(size_t size) {
  EnsureInitialised();
  return rdmj_malloc(size);
}
RDMALLOC_EXPORT void* calloc(size_t n, size_t size) {
  EnsureInitialised();
  return rdmj_calloc(n, size);
}
RDMALLOC_EXPORT void* realloc(void* p, size_t size) {
  EnsureInitialised();
  return rdmj_realloc(p, size);
}
RDMALLOC_EXPORT int posix_memalign(void** p, size_t alignment, size_t size) {
  EnsureInitialised();
  return rdmj_posix_memalign(p, alignment, size);
}
RDMALLOC_EXPORT void* aligned_alloc(size_t alignment, size_t size) {
  EnsureInitialised();
  return rdmj_aligned_alloc(alignment, size);
}
RDMALLOC_EXPORT void* memalign(size_t alignment, size_t size) {
  EnsureInitialised();
  return rdmj_memalign(alignment, size);
}
RDMALLOC_EXPORT void* valloc(size_t size) {
  EnsureInitialised();
  return rdmj_valloc(size);
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
  return rdmj_memalign(page, rounded == 0 ? page : rounded);
}
RDMALLOC_EXPORT void* mallocx(size_t size, int flags) {
  EnsureInitialised();
  return rdmj_mallocx(size, flags);
}
RDMALLOC_EXPORT void* rallocx(void* p, size_t size, int flags) {
  EnsureInitialised();
  return rdmj_rallocx(p, size, flags);
}
RDMALLOC_EXPORT int mallctl(const char* name, void* oldp, size_t* oldlenp, void* newp,
                            size_t newlen) {
  EnsureInitialised();
  // A new arena without hooks of the caller's own gets rdmalloc's, so that its
  // memory is registered heap like every other arena's.
  if (name != nullptr && newp == nullptr && strcmp(name, "arenas.create") == 0) {
    void* hooks = rdmalloc::RdmallocExtentHooks();
    return rdmj_mallctl(name, oldp, oldlenp, &hooks, sizeof hooks);
  }
  return rdmj_mallctl(name, oldp, oldlenp, newp, newlen);
}
RDMALLOC_EXPORT int mallctlnametomib(const char* name, size_t* mibp, size_t* miblenp) {
  EnsureInitialised();
  return rdmj_mallctlnametomib(name, mibp, miblenp);
}
RDMALLOC_EXPORT int mallctlbymib(const size_t* mib, size_t miblen, void* oldp, size_t* oldlenp,
                                 void* newp, size_t newlen) {
  EnsureInitialised();
  return rdmj_mallctlbymib(mib, miblen, oldp, oldlenp, newp, newlen);
}

// C++ allocation: jemalloc's operator new is renamed like malloc.
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
}

__attribute__((visibility("default"))) void* operator new(size_t n) {
  EnsureInitialised();
  return rdmj__Znwm(n);
}
__attribute__((visibility("default"))) void* operator new[](size_t n) {
  EnsureInitialised();
  return rdmj__Znam(n);
}
__attribute__((visibility("default"))) void* operator new(size_t n,
                                                          const std::nothrow_t& t) noexcept {
  EnsureInitialised();
  return rdmj__ZnwmRKSt9nothrow_t(n, t);
}
__attribute__((visibility("default"))) void* operator new[](size_t n,
                                                            const std::nothrow_t& t) noexcept {
  EnsureInitialised();
  return rdmj__ZnamRKSt9nothrow_t(n, t);
}
__attribute__((visibility("default"))) void* operator new(size_t n, std::align_val_t a) {
  EnsureInitialised();
  return rdmj__ZnwmSt11align_val_t(n, a);
}
__attribute__((visibility("default"))) void* operator new[](size_t n, std::align_val_t a) {
  EnsureInitialised();
  return rdmj__ZnamSt11align_val_t(n, a);
}
__attribute__((visibility("default"))) void* operator new(size_t n, std::align_val_t a,
                                                          const std::nothrow_t& t) noexcept {
  EnsureInitialised();
  return rdmj__ZnwmSt11align_val_tRKSt9nothrow_t(n, a, t);
}
__attribute__((visibility("default"))) void* operator new[](size_t n, std::align_val_t a,
                                                            const std::nothrow_t& t) noexcept {
  EnsureInitialised();
  return rdmj__ZnamSt11align_val_tRKSt9nothrow_t(n, a, t);
}
