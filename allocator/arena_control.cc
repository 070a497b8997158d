#include "allocator/arena_control.h"

#include <errno.h>

#include <atomic>
#include <cstring>

#include "allocator/fork.h"
#include "allocator/jemalloc_api.h"
#include "allocator/mutex.h"
#include "allocator/startup_data.h"

namespace rdmalloc {
namespace {

// MALLOCX_ARENA encodes up to 4095 arenas.
constexpr unsigned kMaxArenas = 4096;
constexpr size_t kMaxMib = 8;

// A control node as jemalloc numbers it. Nodes under arena.<i> match any i.
struct Mib {
  size_t v[kMaxMib] = {};
  size_t len = 0;
  bool per_arena = false;
};
RDMALLOC_STARTUP_DATA Mib g_create, g_create_ext, g_hooks_of, g_destroy, g_reset, g_purge,
    g_decay;
RDMALLOC_STARTUP_DATA void (*g_give_back)() = nullptr;
constexpr size_t kArenaIndex = 1;  // arena.<i>.leaf

RDMALLOC_STARTUP_DATA extent_hooks_t* g_ours = nullptr;
RDMALLOC_STARTUP_DATA unsigned g_automatic_arenas = 0;  // opt.narenas: arenas 0..n-1
RDMALLOC_STARTUP_DATA extent_hooks_t* g_defaults = nullptr;
std::atomic<bool> g_internal[kMaxArenas];

// Check, then act, as one step: no arena can be destroyed and made anew
// between the guard's look at its hooks and the write.
RDMALLOC_STARTUP_DATA Mutex<LockRank::kControl> g_control_lock;

void ForkPrepare() { g_control_lock.Lock(); }
void ForkParent() { g_control_lock.Unlock(); }
void ForkChild() { g_control_lock.ResetAfterFork(); }

bool NameToMib(const char* name, Mib* out, bool per_arena = false) {
  out->len = kMaxMib;
  out->per_arena = per_arena;
  if (rdmj_mallctlnametomib(name, out->v, &out->len) != 0) {
    out->len = 0;
    return false;
  }
  return true;
}

bool Is(const Mib& node, const size_t* mib, size_t miblen) {
  if (node.len == 0 || miblen != node.len) return false;
  for (size_t i = 0; i < miblen; i++) {
    if (!(node.per_arena && i == kArenaIndex) && mib[i] != node.v[i]) return false;
  }
  return true;
}

// The hooks arena i runs on; nullptr if it does not exist.
extent_hooks_t* HooksOf(unsigned arena) {
  size_t mib[kMaxMib];
  memcpy(mib, g_hooks_of.v, sizeof mib);
  mib[kArenaIndex] = arena;
  extent_hooks_t* hooks = nullptr;
  size_t len = sizeof hooks;
  if (rdmj_mallctlbymib(mib, g_hooks_of.len, &hooks, &len, nullptr, 0) != 0) return nullptr;
  return hooks;
}

bool Internal(size_t arena) {
  return arena < kMaxArenas && g_internal[arena].load(std::memory_order_acquire);
}

int Guarded(const size_t* mib, size_t miblen, void* oldp, size_t* oldlenp, void* newp,
            size_t newlen) {
  LockGuard g(g_control_lock);
  if (Is(g_create, mib, miblen) && newp == nullptr) {
    extent_hooks_t* ours = g_ours;
    return rdmj_mallctlbymib(mib, miblen, oldp, oldlenp, &ours, sizeof ours);
  }
  if (Is(g_create_ext, mib, miblen) && newp != nullptr && newlen == sizeof(ArenaConfig)) {
    ArenaConfig config;
    memcpy(&config, newp, sizeof config);
    if (config.extent_hooks == nullptr || config.extent_hooks == g_defaults)
      config.extent_hooks = g_ours;
    // Metadata stays off rdmalloc's regions, as for every arena of rdmalloc's.
    if (config.extent_hooks == g_ours) config.metadata_use_hooks = false;
    return rdmj_mallctlbymib(mib, miblen, oldp, oldlenp, &config, sizeof config);
  }
  if (Is(g_hooks_of, mib, miblen) && newp != nullptr) {
    // Automatic arenas are rdmalloc's whether jemalloc made them yet or not
    // (writing the hooks of one not made yet would make it with the caller's).
    size_t arena = mib[kArenaIndex];
    if (arena < g_automatic_arenas ||
        (arena < kMaxArenas && HooksOf(static_cast<unsigned>(arena)) == g_ours))
      return EPERM;
  }
  if ((Is(g_destroy, mib, miblen) || Is(g_reset, mib, miblen)) && Internal(mib[kArenaIndex]))
    return EPERM;
  return rdmj_mallctlbymib(mib, miblen, oldp, oldlenp, newp, newlen);
}

// arena.<i>.purge and .decay ask for memory back now: what rdmalloc keeps for
// reuse goes too, once jemalloc has given its part back.
bool GivesBack(const size_t* mib, size_t miblen) {
  return Is(g_purge, mib, miblen) || Is(g_decay, mib, miblen);
}

int GiveBack(int rc) {
  if (rc == 0 && g_give_back != nullptr) g_give_back();
  return rc;
}

bool Watched(const size_t* mib, size_t miblen) {
  return Is(g_create, mib, miblen) || Is(g_create_ext, mib, miblen) ||
         Is(g_hooks_of, mib, miblen) || Is(g_destroy, mib, miblen) || Is(g_reset, mib, miblen);
}

// The watched nodes, looked up at the first control call, not at start-up:
// jemalloc's first mallctl builds its whole control tree with per-arena
// statistics (a tenth of a small program's start-up), which a program that
// never calls mallctl need not pay for.
std::atomic<bool> g_resolved{false};

void Resolve() {
  if (g_resolved.load(std::memory_order_acquire)) return;
  LockGuard g(g_control_lock);
  if (g_resolved.load(std::memory_order_relaxed)) return;
  size_t len = sizeof g_automatic_arenas;
  rdmj_mallctl("opt.narenas", &g_automatic_arenas, &len, nullptr, 0);
  NameToMib("arenas.create", &g_create);
  NameToMib("experimental.arenas_create_ext", &g_create_ext);
  NameToMib("arena.0.extent_hooks", &g_hooks_of, /*per_arena=*/true);
  NameToMib("arena.0.destroy", &g_destroy, /*per_arena=*/true);
  NameToMib("arena.0.reset", &g_reset, /*per_arena=*/true);
  NameToMib("arena.0.purge", &g_purge, /*per_arena=*/true);
  NameToMib("arena.0.decay", &g_decay, /*per_arena=*/true);
  g_resolved.store(true, std::memory_order_release);
}

}  // namespace

void InitArenaControl(extent_hooks_t* ours, extent_hooks_t* defaults, void (*give_back)()) {
  g_give_back = give_back;
  g_ours = ours;
  g_defaults = defaults;
  ForkHandlers fork;
  fork.prepare = ForkPrepare;
  fork.parent = ForkParent;
  fork.child = ForkChild;
  SetForkHandlers(LockRank::kControl, fork);
}

unsigned CreateArena(extent_hooks_t* hooks, bool internal) {
  Resolve();
  LockGuard g(g_control_lock);
  unsigned ind = 0;
  size_t len = sizeof ind;
  if (rdmj_mallctlbymib(g_create.v, g_create.len, &ind, &len, &hooks, sizeof hooks) != 0 ||
      ind == 0 || ind >= kMaxArenas)
    return 0;
  g_internal[ind].store(internal, std::memory_order_release);
  return ind;
}

int ControlMallctl(const char* name, void* oldp, size_t* oldlenp, void* newp, size_t newlen) {
  Resolve();
  // Every watched node lies under "arena." or "arenas." or is
  // experimental.arenas_create_ext; the rest goes straight to jemalloc.
  if (name != nullptr && (strncmp(name, "arena", 5) == 0 || strncmp(name, "experimental.", 13) == 0)) {
    Mib m;
    if (NameToMib(name, &m) && Watched(m.v, m.len))
      return Guarded(m.v, m.len, oldp, oldlenp, newp, newlen);
    if (m.len != 0 && GivesBack(m.v, m.len))
      return GiveBack(rdmj_mallctlbymib(m.v, m.len, oldp, oldlenp, newp, newlen));
  }
  return rdmj_mallctl(name, oldp, oldlenp, newp, newlen);
}

int ControlMallctlByMib(const size_t* mib, size_t miblen, void* oldp, size_t* oldlenp, void* newp,
                        size_t newlen) {
  Resolve();
  if (mib != nullptr && Watched(mib, miblen))
    return Guarded(mib, miblen, oldp, oldlenp, newp, newlen);
  if (mib != nullptr && GivesBack(mib, miblen))
    return GiveBack(rdmj_mallctlbymib(mib, miblen, oldp, oldlenp, newp, newlen));
  return rdmj_mallctlbymib(mib, miblen, oldp, oldlenp, newp, newlen);
}

}  // namespace rdmalloc
