// The one lock order of the process's allocator: rdmalloc's locks and
// jemalloc's, as docs/DESIGN.md ("Lock order") writes it. A thread may take a
// lock only while every lock it holds ranks lower; TryLock may be used at any
// rank (it cannot wait). Only the fork protocol holds several locks of one
// rank, taken in one fixed order (Mutex::LockInSeries). jemalloc's mutexes
// are one rank, kJemalloc: code that holds a lock ranked above it must never
// call malloc (jemalloc may wait for a lock held by a thread that waits for
// ours), and code that runs inside jemalloc (its extent hooks) may only
// TryLock locks ranked below it.
//
// The fork protocol (allocator/fork.h) takes the locks that take part in
// fork in exactly this order, jemalloc's included.
//
// With RDMALLOC_WITNESS defined (--config=ubsan and --config=tsan build it),
// every acquisition is checked against this order at run time and a
// violation aborts with both ranks named, so each test also proves the order.
#ifndef RDMALLOC_ALLOCATOR_LOCK_ORDER_H_
#define RDMALLOC_ALLOCATOR_LOCK_ORDER_H_

#include <cstdint>

namespace rdmalloc {

enum class LockRank : uint8_t {
  // rdmalloc's one-time start (and its restart in a fork child): other
  // threads wait for it, and it calls jemalloc. Not a Mutex.
  kInit = 0,
  // Held while calling jemalloc (they may malloc, or make arenas).
  kClassArenas = 1,  // making an access class's arena (arenas.create)
  kControl = 2,      // the mallctl guard: arena creation, destruction, hook changes
  kApi = 3,          // backend start, the domain table
  kObservers = 4,    // the release observers' table
  kRegion = 5,       // Region::reg_lock: (de)registering one region (ibv_reg_mr mallocs)
  kDataPath = 6,     // a verbs domain's data path: QP, CQ, staging MR (they malloc)
  // jemalloc's own mutexes, in jemalloc's witness order (ctl_mtx, arenas,
  // background threads, each arena's, base, ...). Its extent hooks run here.
  kJemalloc = 7,
  // Taken inside jemalloc's hooks: never held across malloc.
  kHeap = 8,          // a region store shard (list, page maps), or its descriptor pool
  kReleaseQueue = 9,  // regions waiting for the release thread
  kRing = 10,         // a uring domain's slot table and ring (system calls only)
  kMrTable = 11,      // the interposer's MR records (system calls only)
  kCount = 12,
};

const char* LockRankName(LockRank rank);

namespace witness {
#ifdef RDMALLOC_WITNESS
void Acquiring(LockRank rank);  // before a blocking acquisition: checks the order
void AcquiringInSeries(LockRank rank);  // Mutex::LockInSeries: others of its rank may be held
void Acquired(LockRank rank);   // after any acquisition (Lock or a successful TryLock)
void Released(LockRank rank);
// jemalloc as a lock: entering it (malloc and friends) and running inside it
// (its hooks call these on entry and exit).
inline void CallingJemalloc() { Acquiring(LockRank::kJemalloc); }
void EnterHook();
void LeaveHook();
void ForgetHeld();  // a fork child: every lock was reset
#else
inline void Acquiring(LockRank) {}
inline void AcquiringInSeries(LockRank) {}
inline void Acquired(LockRank) {}
inline void Released(LockRank) {}
inline void CallingJemalloc() {}
inline void EnterHook() {}
inline void LeaveHook() {}
inline void ForgetHeld() {}
#endif
}  // namespace witness

// Scope of one extent hook: the thread is inside jemalloc.
class HookScope {
 public:
  HookScope() { witness::EnterHook(); }
  ~HookScope() { witness::LeaveHook(); }
  HookScope(const HookScope&) = delete;
  HookScope& operator=(const HookScope&) = delete;
};

}  // namespace rdmalloc

#endif  // RDMALLOC_ALLOCATOR_LOCK_ORDER_H_
