// The registered heap: rdmalloc's page-level allocator under jemalloc.
//
// jemalloc asks for extents through our hooks (allocator/extent_hooks.cc);
// the heap serves them from regions it mapped, keeps each region registered
// with every domain while any page of it is in jemalloc's hands, and
// deregisters then unmaps a region only once all of it came back.
// docs/DESIGN.md names every state and transition used here.
#ifndef RDMALLOC_ALLOCATOR_HEAP_H_
#define RDMALLOC_ALLOCATOR_HEAP_H_

#include <atomic>
#include <cstddef>
#include <cstdio>
#include <cstdint>

#include "allocator/config.h"
#include "allocator/rdmalloc.h"
#include "allocator/region.h"
#include "allocator/region_map.h"
#include "allocator/spin_lock.h"
#include "verbs/registrar.h"

namespace rdmalloc {

constexpr size_t kMaxRegions = 16384;
// Access classes: 0 is the plain heap, 1..7 the RDMALLOC_REMOTE_* combinations.
constexpr unsigned kAccessClasses = 8;
constexpr int kMaxObservers = 8;

// The registration rights of an access class (plus local write, which remote
// write needs and every receive buffer does).
constexpr int ClassRights(unsigned access_class) {
  return kAccessLocalWrite | ((access_class & 1) ? kAccessRemoteRead : 0) |
         ((access_class & 2) ? kAccessRemoteWrite : 0) |
         ((access_class & 4) ? kAccessRemoteAtomic : 0);
}

// "r", "w", "a" or a combination: the remote rights of an access class.
inline const char* ClassRightsName(unsigned access_class) {
  static const char* const kNames[kAccessClasses] = {"", "r", "w", "rw", "a", "ra", "wa", "rwa"};
  return access_class < kAccessClasses ? kNames[access_class] : "?";
}

// One live region as VisitRegions sees it.
struct RegionInfo {
  uintptr_t base = 0;
  size_t size = 0, pages = 0, pages_in_use = 0;
  bool dedicated = false;
  unsigned access_class = 0;
  struct {
    uint32_t state, lkey, rkey;  // RegSlot::state
  } reg[kMaxDomains] = {};
};

class Heap {
 public:
  static constexpr unsigned kStripes = 64;  // lookup counters, one cache line each

  constexpr Heap() = default;
  Heap(const Heap&) = delete;
  Heap& operator=(const Heap&) = delete;

  // Called once while malloc initialises: Configure before the hooks are
  // installed (arena creation already maps regions), Start after.
  void Configure(const Config& config);
  void Start();
  const Config& config() const { return config_; }

  // --- Hook side: may run inside jemalloc; never allocates, never blocks on
  // a lock that a malloc-calling thread could hold.
  // nullptr: no region of ours can take it (the hook then falls back).
  // Serves only from regions of `access_class`.
  void* AllocExtent(unsigned access_class, void* new_addr, size_t size, size_t alignment,
                    bool* zero);
  // The region wholly containing [addr, addr+size), or nullptr (foreign).
  Region* RegionOf(const void* addr, size_t size) const;
  // jemalloc gave [addr, addr+size) back for good (dalloc or destroy).
  void FreeExtent(Region* r, void* addr, size_t size);
  void CountForeign() { foreign_extents_.fetch_add(1, std::memory_order_relaxed); }
  // The access class of the live allocation at p (0 for anything not in a
  // class region). Lock-free; for free() to route class memory past tcaches.
  unsigned AccessClassOf(const void* p) const {
    Region* r = map_.Find(reinterpret_cast<uintptr_t>(p));
    return r != nullptr ? r->access_class : 0;
  }

  // --- API side: ordinary context; may allocate and block.
  // The hit path is inline: no lock, no allocation, no system call.
  inline int Lookup(const void* addr, size_t len, ibv_pd* pd, rdmalloc_keys* out);
  int AddDomain(ibv_pd* pd, int access);
  int RemoveDomain(ibv_pd* pd);
  const char* BackendName();
  // For reports: the device in use, or what stands in for one.
  const char* DeviceDescription();
  int Dma(const rdmalloc_keys* k, size_t off, void* buf, size_t n, bool to_memory);
  int Stats(struct rdmalloc_stats* out, size_t size);
  // Release notifications (rdmalloc_on_release). Callbacks run on the release
  // thread only, outside every lock; nothing here waits for one.
  int AddObserver(rdmalloc_release_fn fn, void* arg);
  int RemoveObserver(rdmalloc_release_fn fn, void* arg);
  // Starts the release thread if queued work or observers need it (a fork
  // child has none). API context only: pthread_create allocates.
  void EnsureReleaseThread();
  int DumpRegions(FILE* out);
  // Calls visit once per live region, outside every lock (it may allocate).
  // Returns the number of regions visited.
  int VisitRegions(void (*visit)(const RegionInfo& info, void* ctx), void* ctx);
  // RDMALLOC_VERBOSE logging: one line on stderr, built on the stack and
  // written with write(2), so it is safe in hook context.
  void Log(int level, const char* format, ...) const __attribute__((format(printf, 3, 4)));

  // The heap's stages of the fork protocol (allocator/fork.h): api_lock_ at
  // kApi, heap_lock_ at kHeap, pending_lock_ at kReleaseQueue. The child
  // forgets every registration (they are the parent's kernel objects).
  void InstallForkHandlers();

 private:
  struct DomainSlot {
    enum : int { kFree = 0, kOpen = 1, kClosing = 2 };
    std::atomic<ibv_pd*> pd{nullptr};
    std::atomic<Domain*> domain{nullptr};
    std::atomic<int> state{kFree};
    std::atomic<int> access{0};  // rights of the plain heap under this domain
  };
  // An observer slot (free while fn is nullptr); guarded by api_lock_.
  struct Observer {
    rdmalloc_release_fn fn = nullptr;
    void* arg = nullptr;
  };
  // A removed observer, owed its last call fn(NULL, 0, arg) by the release
  // thread. Allocated by RemoveObserver (API context), freed after the call.
  struct Goodbye {
    rdmalloc_release_fn fn;
    void* arg;
    Goodbye* next;
  };
  // Lookup counters of one thread (or a few, past kStripes threads), on a
  // cache line of their own. Bumped with a plain load and store: exact while
  // each thread has its own stripe.
  struct alignas(64) Stripe {
    std::atomic<uint64_t> lookups{0}, not_ours{0}, cross{0}, einval{0};
  };
  static void Bump(std::atomic<uint64_t>& c) {
    c.store(c.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
  }
  Stripe& MyStripe() {
    unsigned stripe = t_stripe_index();
    return stripes_[stripe];
  }
  static unsigned t_stripe_index();
  struct DomainCounters {
    std::atomic<uint64_t> bytes_registered{0}, reg_calls{0}, dereg_calls{0}, reg_failures{0};
    void Reset() {
      bytes_registered = 0;
      reg_calls = 0;
      dereg_calls = 0;
      reg_failures = 0;
    }
  };

  int DomainIndex(ibv_pd* pd) const { return pd == nullptr ? 0 : DomainIndexSlow(pd); }
  int DomainIndexSlow(ibv_pd* pd) const;
  __attribute__((noinline)) int LookupSlow(uintptr_t a, size_t len, int d, rdmalloc_keys* out);
  inline void FillKeys(Region* r, int d, uintptr_t a, size_t len, uint32_t lkey, uint32_t rkey,
                       uint32_t shift, void* handle, int access, rdmalloc_keys* out) const;
  int EnsureBackend();
  int Fail(int code, std::atomic<uint64_t>& counter) {
    Bump(counter);
    return code;
  }

  // Page heap (heap_lock_ held).
  // Hands pages to jemalloc; returns whether any of them may be non-zero.
  bool CarveLocked(Region* r, size_t first, size_t n);
  Region* NewRegion(size_t bytes, size_t alignment, unsigned access_class);
  void Recycle(Region* r);

  // Registration (r->reg_lock held).
  int RegisterLocked(Region* r, int d);
  void DeregisterLocked(Region* r, int d);
  int RegionAccess(const Region* r, int d) const;
  bool ReleaseLocked(Region* r);
  void Unmap(Region* r);
  void Unlock(Region* r);
  void RunRelease(Region* r);
  // The release thread's work: queued regions, then observers' last calls.
  void ReleaseQueued();
  void SayGoodbyes();
  void Notify(uintptr_t base, size_t len);
  void AddReleaseWork();
  static void* ReleaseThreadMain(void* heap);
  void RegisterAllLive(int d);
  // Fork stages.
  void ForkChildApi();
  void ForkChildHeap();
  void ForkChildReleaseQueue();

  Config config_;
  Registrar* registrar_ = nullptr;
  std::atomic<int> backend_ready_{0};
  int backend_err_ = 0;
  SpinLock api_lock_{LockRank::kApi};  // backend start, domain table, observer table

  DomainSlot domains_[kMaxDomains];
  DomainCounters domain_counters_[kMaxDomains];

  SpinLock heap_lock_{LockRank::kHeap};  // region list, page maps, descriptor pool
  RegionMap map_;
  Region* regions_ = nullptr;  // live regions by address
  Region* free_descriptors_ = nullptr;
  size_t descriptors_used_ = 0;
  // Regions grow from one chunk to config_.region_size, per access class: a
  // class used for a few buffers should not pin a full-size region.
  size_t next_region_bytes_[kAccessClasses] = {kChunkSize, kChunkSize, kChunkSize,
                                               kChunkSize, kChunkSize, kChunkSize,
                                               kChunkSize, kChunkSize};
  Region pool_[kMaxRegions];

  SpinLock pending_lock_{LockRank::kReleaseQueue};
  Region* pending_ = nullptr;  // empty regions whose release is the release thread's
  std::atomic<int> pending_count_{0};
  std::atomic<int> releasing_{0};     // taken off pending_, not yet unmapped
  std::atomic<int> release_work_{0};  // the release thread's futex word: work was added

  Observer observers_[kMaxObservers];
  Goodbye* goodbyes_ = nullptr;         // api_lock_
  std::atomic<int> goodbyes_owed_{0};   // entries in goodbyes_
  std::atomic<int> observer_count_{0};  // slots in use
  std::atomic<int> hook_busy_{0};  // FreeExtent calls under way (purge or release decided)
  std::atomic<bool> release_thread_{false};

  Stripe stripes_[kStripes];
  std::atomic<uint64_t> regions_created_{0}, regions_released_{0}, bytes_mapped_{0},
      pages_in_use_{0}, bytes_registered_{0}, bytes_pinned_{0}, reg_calls_{0}, dereg_calls_{0}, reg_ns_{0},
      dereg_ns_{0}, reg_failures_{0}, lookup_reg_failed_{0}, lookup_slow_{0}, foreign_extents_{0},
      releases_deferred_{0}, cap_hits_{0}, releases_notified_{0};
};

// Each thread bumps its own stripe of the lookup counter: no shared cache
// line on the lookup path (threads beyond kStripes share stripes).
// __thread, not thread_local: no TLS wrapper function across translation units.
extern __thread unsigned t_stripe __attribute__((tls_model("initial-exec"), visibility("hidden")));
unsigned AssignStripe();

extern __attribute__((visibility("hidden"))) Heap g_heap;
inline Heap& TheHeap() { return g_heap; }

inline unsigned Heap::t_stripe_index() {
  unsigned stripe = t_stripe;
  return __builtin_expect(stripe != ~0u, 1) ? stripe : AssignStripe();
}

inline void Heap::FillKeys(Region* r, int d, uintptr_t a, size_t len, uint32_t lkey, uint32_t rkey,
                    uint32_t shift, void* handle, int access, rdmalloc_keys* out) const {
  uintptr_t base = r->begin();
  uint32_t step = shift != 0 ? static_cast<uint32_t>((a - base) >> shift) : 0;
  out->lkey = lkey + step;
  out->rkey = rkey + step;
  out->handle = handle;
  out->mr = static_cast<ibv_mr*>(r->reg[d].mr.load(std::memory_order_relaxed));
  out->region_base = reinterpret_cast<void*>(base);
  out->region_len = r->length();
  out->addr = reinterpret_cast<const void*>(a);
  out->len = len;
  out->reg_errno = 0;
  out->domain = d;
  out->access = access;
}

inline int Heap::Lookup(const void* addr, size_t len, ibv_pd* pd, rdmalloc_keys* out) {
  Stripe& st = MyStripe();
  Bump(st.lookups);
  uintptr_t a = reinterpret_cast<uintptr_t>(addr);
  if (out == nullptr || len > UINTPTR_MAX - a) return Fail(RDMALLOC_EINVAL, st.einval);
  int d = DomainIndex(pd);
  if (d < 0) return Fail(RDMALLOC_EINVAL, st.einval);
  Region* r = map_.Find(a);
  if (r == nullptr) return Fail(RDMALLOC_ENOTOURS, st.not_ours);
  uint64_t seq = r->seq.load(std::memory_order_acquire);
  uintptr_t base = r->begin();
  size_t size = r->length();
  if (!(seq & 1) || a < base || a - base >= size) return Fail(RDMALLOC_ENOTOURS, st.not_ours);
  if (len > size - (a - base)) return Fail(RDMALLOC_ECROSS, st.cross);
  RegSlot& s = r->reg[d];
  uint32_t q = s.seq.load(std::memory_order_acquire);
  if (!(q & 1) && s.state.load(std::memory_order_relaxed) == RegSlot::kRegistered) {
    uint32_t lkey = s.lkey.load(std::memory_order_relaxed);
    uint32_t rkey = s.rkey.load(std::memory_order_relaxed);
    uint32_t shift = s.key_shift.load(std::memory_order_relaxed);
    void* handle = s.handle.load(std::memory_order_relaxed);
    int access = s.access.load(std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_acquire);
    if (s.seq.load(std::memory_order_relaxed) == q && r->seq.load(std::memory_order_relaxed) == seq) {
      FillKeys(r, d, a, len, lkey, rkey, shift, handle, access, out);
      return RDMALLOC_OK;
    }
  }
  return LookupSlow(a, len, d, out);
}

}  // namespace rdmalloc

#endif  // RDMALLOC_ALLOCATOR_HEAP_H_
