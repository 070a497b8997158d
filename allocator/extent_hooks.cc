#include "allocator/extent_hooks.h"

#include <jemalloc/jemalloc.h>

#include <dlfcn.h>
#include <pthread.h>
#include <signal.h>
#include <sys/types.h>

#include <cstdio>
#include <cstring>

#include "allocator/arena_control.h"
#include "allocator/fork.h"
#include "allocator/heap.h"
#include "allocator/jemalloc_api.h"
#include "allocator/lock_order.h"
#include "allocator/spin_lock.h"

namespace rdmalloc {

std::atomic<bool> g_classes_in_use{false};

namespace {

// MALLOCX_ARENA encodes up to 4095 arenas.
constexpr unsigned kMaxArenas = 4096;
std::atomic<uint8_t> g_arena_class[kMaxArenas];
std::atomic<unsigned> g_class_arena[kAccessClasses];
SpinLock g_class_lock{LockRank::kClassArenas};

// jemalloc's base allocator maps each arena's metadata (the arena itself,
// extent descriptors) through that arena's hooks, always as whole huge pages
// with huge-page alignment. Data extents never look like that: a large
// allocation carries a one-page pad (jemalloc's cache-oblivious layout, a
// build option that Debian's jemalloc has on; test/access_class_test checks
// that aligned large extents are not taken for metadata).
// Metadata gets regions of its own that are never registered: no peer's rkey
// covers allocator state, and a lookup of a neighbouring buffer cannot pin
// metadata, which is never freed, for good.
unsigned ClassForExtent(unsigned arena_ind, size_t size, size_t alignment) {
  if (alignment == kChunkSize && size % kChunkSize == 0) return kMetadataRegions;
  if (arena_ind >= kMaxArenas) return 0;
  return g_arena_class[arena_ind].load(std::memory_order_acquire);
}

// jemalloc's own hooks: they still own the few extents it mapped while it
// initialised, before ours were installed.
extent_hooks_t* g_default = nullptr;

void* Alloc(extent_hooks_t*, void* new_addr, size_t size, size_t alignment, bool* zero,
            bool* commit, unsigned arena_ind) {
  HookScope in_jemalloc;
  unsigned c = ClassForExtent(arena_ind, size, alignment);
  TheHeap().Log(3, "extent alloc %zu bytes, alignment %zu, arena %u: access class %u", size,
                alignment, arena_ind, c);
  if (void* p = TheHeap().AllocExtent(c, new_addr, size, alignment, zero)) {
    *commit = true;  // regions are always committed: pages may be pinned
    return p;
  }
  if (new_addr != nullptr) return nullptr;  // growth in place is just not possible here
  // Class memory must be registered with its rights, or not exist.
  if (c != 0 && c != kMetadataRegions) return nullptr;
  // No region could be made (address space or descriptors exhausted): hand out
  // unregistered memory rather than fail the allocation. Lookups report it.
  void* p = g_default->alloc(g_default, nullptr, size, alignment, zero, commit, arena_ind);
  if (p != nullptr) TheHeap().CountForeign();
  return p;
}

// Accept: the pages go back to the heap, which keeps them registered (or
// releases the whole region once it is empty).
bool Dalloc(extent_hooks_t*, void* addr, size_t size, bool committed, unsigned arena_ind) {
  HookScope in_jemalloc;
  if (Region* r = TheHeap().RegionOf(addr, size)) {
    TheHeap().FreeExtent(r, addr, size);
    return false;
  }
  return g_default->dalloc(g_default, addr, size, committed, arena_ind);
}

void Destroy(extent_hooks_t*, void* addr, size_t size, bool committed, unsigned arena_ind) {
  HookScope in_jemalloc;
  if (Region* r = TheHeap().RegionOf(addr, size)) {
    TheHeap().FreeExtent(r, addr, size);
    return;
  }
  g_default->destroy(g_default, addr, size, committed, arena_ind);
}

bool Commit(extent_hooks_t*, void* addr, size_t size, size_t offset, size_t length,
            unsigned arena_ind) {
  if (TheHeap().RegionOf(addr, size) != nullptr) return false;  // never decommitted
  return g_default->commit(g_default, addr, size, offset, length, arena_ind);
}

// Refuse: decommitting or purging would give the CPU a new page while an MR
// may still point at the old one. jemalloc then falls back to dalloc.
bool Decommit(extent_hooks_t*, void* addr, size_t size, size_t offset, size_t length,
              unsigned arena_ind) {
  if (TheHeap().RegionOf(addr, size) != nullptr) return true;
  return g_default->decommit(g_default, addr, size, offset, length, arena_ind);
}

bool PurgeLazy(extent_hooks_t*, void* addr, size_t size, size_t offset, size_t length,
               unsigned arena_ind) {
  if (TheHeap().RegionOf(addr, size) != nullptr || g_default->purge_lazy == nullptr) return true;
  return g_default->purge_lazy(g_default, addr, size, offset, length, arena_ind);
}

bool PurgeForced(extent_hooks_t*, void* addr, size_t size, size_t offset, size_t length,
                 unsigned arena_ind) {
  if (TheHeap().RegionOf(addr, size) != nullptr || g_default->purge_forced == nullptr)
    return true;
  return g_default->purge_forced(g_default, addr, size, offset, length, arena_ind);
}

bool Split(extent_hooks_t*, void* addr, size_t size, size_t size_a, size_t size_b, bool committed,
           unsigned arena_ind) {
  if (TheHeap().RegionOf(addr, size) != nullptr) return false;  // bookkeeping only
  return g_default->split(g_default, addr, size, size_a, size_b, committed, arena_ind);
}

// Never let an extent span two regions: one allocation must have one MR.
bool Merge(extent_hooks_t*, void* addr_a, size_t size_a, void* addr_b, size_t size_b,
           bool committed, unsigned arena_ind) {
  Region* a = TheHeap().RegionOf(addr_a, size_a);
  Region* b = TheHeap().RegionOf(addr_b, size_b);
  if (a != nullptr || b != nullptr) return a != b;
  return g_default->merge(g_default, addr_a, size_a, addr_b, size_b, committed, arena_ind);
}

extent_hooks_t g_hooks = {Alloc,     Dalloc,      Destroy, Commit, Decommit,
                          PurgeLazy, PurgeForced, Split,   Merge};

// jemalloc starts its first background thread (MALLOC_CONF background_thread)
// at the end of its own initialisation, before rdmalloc's hooks exist; the C
// library's pthread_create then mallocs (the thread's TLS), and arena 0 would
// serve that, and every later block of the same size class, from a slab made
// with jemalloc's default hooks: memory outside rdmalloc's heap. jemalloc
// finds pthread_create with dlsym(RTLD_NEXT), falling back to the symbol; both
// are renamed (third_party/jemalloc_renames.txt) and land here: until the
// hooks are installed the thread is noted, and started by InstallExtentHooks
// as jemalloc would (all signals blocked, no attributes).
struct DeferredThread {
  pthread_t* thread;
  void* (*start)(void*);
  void* arg;
};
constexpr int kMaxDeferredThreads = 4;
DeferredThread g_deferred[kMaxDeferredThreads];
int g_deferred_count = 0;
std::atomic<bool> g_hooks_installed{false};

void StartDeferredThreads() {
  for (int i = 0; i < g_deferred_count; i++) {
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    int err = pthread_create(g_deferred[i].thread, nullptr, g_deferred[i].start, g_deferred[i].arg);
    pthread_sigmask(SIG_SETMASK, &old, nullptr);
    if (err != 0) TheHeap().Log(0, "cannot start jemalloc's background thread (errno %d)", err);
  }
  g_deferred_count = 0;
}

}  // namespace

unsigned ClassArena(unsigned access_class) {
  if (access_class == 0 || access_class >= kAccessClasses) return 0;
  unsigned a = g_class_arena[access_class].load(std::memory_order_acquire);
  if (a != 0) return a;
  SpinLockGuard g(g_class_lock);
  a = g_class_arena[access_class].load(std::memory_order_relaxed);
  if (a != 0) return a;
  unsigned ind = CreateArena(&g_hooks, /*internal=*/true);
  if (ind == 0 || ind >= kMaxArenas) return 0;
  g_arena_class[ind].store(static_cast<uint8_t>(access_class), std::memory_order_release);
  g_classes_in_use.store(true, std::memory_order_release);
  g_class_arena[access_class].store(ind, std::memory_order_release);
  return ind;
}

void InstallExtentHooks() {
  size_t len = sizeof g_default;
  rdmj_mallctl("arena.0.extent_hooks", &g_default, &len, nullptr, 0);
  unsigned narenas = 0;
  len = sizeof narenas;
  rdmj_mallctl("arenas.narenas", &narenas, &len, nullptr, 0);
  extent_hooks_t* ours = &g_hooks;
  for (unsigned i = 0; i < narenas; i++) {
    // For arenas 1.. this creates them now, with our hooks, before any thread
    // can be given one with jemalloc's defaults.
    char name[64];
    snprintf(name, sizeof name, "arena.%u.extent_hooks", i);
    rdmj_mallctl(name, nullptr, nullptr, &ours, sizeof ours);
  }
  g_hooks_installed.store(true, std::memory_order_release);
  StartDeferredThreads();
  // From here on every control path goes through the guard.
  InitArenaControl(&g_hooks, g_default);
  ForkHandlers fork;
  fork.prepare = [] { g_class_lock.Lock(); };
  fork.parent = [] { g_class_lock.Unlock(); };
  fork.child = [] { g_class_lock.ResetAfterFork(); };
  SetForkHandlers(LockRank::kClassArenas, fork);
}

void SetDirtyDecay(long ms) {
  ssize_t value = ms;
  rdmj_mallctl("arenas.dirty_decay_ms", nullptr, nullptr, &value, sizeof value);
  unsigned narenas = 0;
  size_t len = sizeof narenas;
  rdmj_mallctl("arenas.narenas", &narenas, &len, nullptr, 0);
  for (unsigned i = 0; i < narenas; i++) {
    char name[64];
    snprintf(name, sizeof name, "arena.%u.dirty_decay_ms", i);
    rdmj_mallctl(name, nullptr, nullptr, &value, sizeof value);
  }
}

}  // namespace rdmalloc

// Applied after MALLOC_CONF, so the user cannot undo what the design needs:
// retain:false makes jemalloc give every unused extent back through dalloc
// (rdmalloc's heap then does the retaining, registration-aware);
// oversize_threshold:0 keeps huge allocations out of the lazily created
// huge arena, which would get jemalloc's default hooks.
extern "C" {
__attribute__((visibility("hidden"))) extern const char* malloc_conf_2_conf_harder;
const char* malloc_conf_2_conf_harder = "retain:false,oversize_threshold:0";
}

extern "C" int rdmj_pthread_create(pthread_t* thread, const pthread_attr_t* attr,
                                   void* (*start)(void*), void* arg) {
  using rdmalloc::g_deferred;
  if (!rdmalloc::g_hooks_installed.load(std::memory_order_acquire) && attr == nullptr &&
      rdmalloc::g_deferred_count < rdmalloc::kMaxDeferredThreads) {
    g_deferred[rdmalloc::g_deferred_count++] = {thread, start, arg};
    return 0;
  }
  return pthread_create(thread, attr, start, arg);
}

// jemalloc's only dlsym: dlsym(RTLD_NEXT, "pthread_create").
extern "C" void* rdmj_dlsym(void* handle, const char* name) {
  if (strcmp(name, "pthread_create") == 0) return reinterpret_cast<void*>(&rdmj_pthread_create);
  return dlsym(handle, name);
}
