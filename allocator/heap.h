// The registered heap: the facade over the allocator's rooms.
//
// jemalloc asks for extents through our hooks (allocator/extent_hooks.cc);
// the heap serves them from the region store (allocator/region_store.h),
// keeps each region registered with every domain while any page of it is in
// jemalloc's hands (allocator/registrations.h), and releases a region only
// once all of it came back: deregistered, observers told, unmapped, on the
// spot or through the release pipeline (allocator/release_pipeline.h). The
// facade decides what happens when; each room keeps its own state.
// docs/DESIGN.md names every state and transition used here.
#ifndef RDMALLOC_ALLOCATOR_HEAP_H_
#define RDMALLOC_ALLOCATOR_HEAP_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdio>

#include "allocator/config.h"
#include "allocator/rdmalloc.h"
#include "allocator/region.h"
#include "allocator/region_store.h"
#include "allocator/registrations.h"
#include "allocator/release_pipeline.h"

namespace rdmalloc {

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

// Lookup counters of one thread (or a few, past Heap::kStripes threads), on
// a cache line of their own. Bumped with a plain load and store: exact while
// each thread has its own stripe.
struct alignas(64) LookupStripe {
  std::atomic<uint64_t> lookups{0}, not_ours{0}, cross{0}, einval{0};
  std::atomic<uint64_t> mrs_served{0}, mrs_served_gone{0}, mrs_forwarded{0};
};

class Heap {
 public:
  static constexpr unsigned kStripes = 64;  // lookup counters, one cache line each
  // Free pages kept resident (RDMALLOC_RETAIN) that no request took for this
  // long are purged: retention serves reuse, not memory nobody asks for. A
  // loop over large blocks reuses within milliseconds; at 1 s, mstress kept
  // 1.08-1.21x jemalloc's peak RSS, at 100 ms 1.02-1.05x.
  static constexpr uint64_t kIdleEpochNs = 100 * 1000 * 1000;
  // Untouched pages (past sparse large blocks' heads) are purged this often,
  // so that any a program did touch there are not kept: sparse_blocks, which
  // writes each block's last byte too, peaked at 31 MiB RSS at 100 ms, 16 MiB
  // at 10 ms, 13 MiB at 3 ms (jemalloc: 12), and ran 1.1x / 1.5x slower at 3 ms.
  static constexpr uint64_t kSweepNs = 10 * 1000 * 1000;
  // Or sooner, after this many frees gave untouched pages back: by the clock
  // alone, what is kept grows with the rate of frees (on a kernel that
  // faulted twice as fast, sparse_blocks at 2 threads peaked at 1.07-1.31x
  // jemalloc's RSS). After 256: 0.58-0.65x, as fast (64: 0.45x, 0.78x as fast).
  static constexpr uint64_t kSweepGives = 256;
  // An extent that faults in at least this many new pages gives back as
  // many retained ones: what rdmalloc keeps then never raises the peak RSS.
  static constexpr size_t kMatchedNewPages = (size_t{2} << 20) >> kPageShift;

  constexpr Heap() = default;
  Heap(const Heap&) = delete;
  Heap& operator=(const Heap&) = delete;

  // Called once while malloc initialises: Configure before jemalloc maps its
  // first extent, Start after the hooks are checked.
  void Configure(const Config& config);
  void Start();
  const Config& config() const { return config_.get(); }

  // --- Hook side: may run inside jemalloc; never allocates, never blocks on
  // a lock that a malloc-calling thread could hold.
  // nullptr: no region of ours can take it (the hook then falls back).
  // Serves `arena`'s extents from regions of `access_class`.
  void* AllocExtent(unsigned arena, unsigned access_class, void* new_addr, size_t size,
                    size_t alignment, bool* zero);
  // The region wholly containing [addr, addr+size), or nullptr (foreign).
  Region* RegionOf(const void* addr, size_t size) const { return store_.RegionOf(addr, size); }
  // RegionOf if the map's guess names it, else nullptr (RegionMap::Guess).
  Region* GuessRegionOf(const void* addr, size_t size) const {
    return store_.GuessRegionOf(addr, size);
  }
  // jemalloc gave [addr, addr+size) back for good (dalloc or destroy). A
  // cold extent is one stock jemalloc would purge: kept resident for its
  // decay time already, or only small blocks given back at once (an arena's
  // end; the merge hook keeps them from coalescing that far otherwise). Its
  // pages are not kept (see HowFreed in the hooks).
  // `held`: HeldBlock's answer for it (one shard lock per freed extent).
  enum class Freed { kWarm, kCold };
  void FreeExtent(Region* r, void* addr, size_t size, Freed how, PageMap::Block held);
  // The largest block that extent holds part of (kSmall below kLargeBlock
  // without a lock: no part of it can be a fresh large block's whole 2 MiB page,
  // and the hooks need no more).
  PageMap::Block HeldBlock(Region* r, const void* addr, size_t size) {
    return size < kLargeBlock ? PageMap::Block::kSmall : store_.HeldBlock(r, addr, size);
  }
  void CountForeign() { foreign_extents_.fetch_add(1, std::memory_order_relaxed); }
  // The access class of the live allocation at p (0 for anything not in a
  // class region). Lock-free; for free() to route class memory past tcaches.
  unsigned AccessClassOf(const void* p) const {
    Region* r = store_.Find(reinterpret_cast<uintptr_t>(p));
    return r != nullptr ? r->access_class : 0;
  }

  // --- API side: ordinary context; may allocate and block, never waits for
  // a release callback. The lookup hit path is inline: no lock, no
  // allocation, no system call.
  inline int Lookup(const void* addr, size_t len, ibv_pd* pd, rdmalloc_keys* out);
  int AddDomain(ibv_pd* pd, int access);
  int RemoveDomain(ibv_pd* pd);
  // The program's own memory registrations (allocator/verbs_interpose.cc).
  // Serves one on [addr, addr+len) under pd (not null) with `access`
  // (RDMALLOC_ACCESS_* bits) from the region's registration: a pd seen for
  // the first time is added with RDMALLOC_ACCESS's rights. RDMALLOC_OK: *out
  // filled and out->region held (DropHold when the MR goes). Otherwise the
  // caller registers for itself (and holds with HoldRange). Inline, like
  // Lookup: a registered region on a known pd costs no call.
  struct Served {
    uint32_t lkey, rkey;
    const ibv_mr* region_mr;  // the region's registration (its handle is the kernel's)
    Region* region;
  };
  inline int ServeRegistration(ibv_pd* pd, const void* addr, size_t len, int access,
                               Served* out);
  // Holds every live region with pages in [addr, addr+len), up to `max`:
  // while held, none of their pages is purged and none is released. Returns
  // how many are held.
  size_t HoldRange(const void* addr, size_t len, Region** held, size_t max);
  void DropHold(Region* r) {
    if (store_.Drop(r) == RegionStore::Gave::kEmpty) Release(r);
  }
  // What the interposer counts, for rdmalloc_stats and the report: served,
  // deregistered and forwarded MRs on the calling thread's stripe (a served
  // pair then costs no shared atomic), forwarded MRs on heap pages here.
  void CountServed() { Bump(MyStripe().mrs_served); }
  void CountServedGone() { Bump(MyStripe().mrs_served_gone); }
  void CountForwarded() { Bump(MyStripe().mrs_forwarded); }
  std::atomic<int64_t>& forwarded_on_heap() { return forwarded_on_heap_; }
  const char* BackendName() { return regs_.BackendName(); }
  // For reports: the device in use, or what stands in for one.
  const char* DeviceDescription() { return regs_.DeviceDescription(); }
  int Dma(const rdmalloc_keys* k, size_t off, void* buf, size_t n, bool to_memory);
  int Stats(struct rdmalloc_stats* out, size_t size);
  // Release notifications (rdmalloc_on_release).
  int AddObserver(rdmalloc_release_fn fn, void* arg);
  int RemoveObserver(rdmalloc_release_fn fn, void* arg) {
    return release_.RemoveObserver(fn, arg);
  }
  // Starts the release thread if queued work, observers or the backend need
  // it (a fork child has none). API context only: pthread_create allocates.
  void EnsureReleaseThread() { release_.EnsureThread(regs_.has_backend() && !regs_.hook_safe()); }
  // Gives back what RDMALLOC_RETAIN keeps: releases kept empty regions and
  // purges resident free pages of unregistered regions (arena.<i>.purge,
  // malloc_trim). API context.
  void GiveBackRetained();
  int DumpRegions(FILE* out);
  // Calls visit once per live region, outside every lock (it may allocate).
  // Returns the number of regions visited.
  int VisitRegions(void (*visit)(const RegionInfo& info, void* ctx), void* ctx);

 private:
  using Stripe = LookupStripe;
  static void Bump(std::atomic<uint64_t>& c) {
    c.store(c.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
  }
  inline Stripe& MyStripe();
  // Gives the calling thread its stripe (t_stripe).
  Stripe* AssignStripe();
  int Fail(int code, std::atomic<uint64_t>& counter) {
    Bump(counter);
    return code;
  }
  // A miss of the hit path, counted on this thread's stripe, found again
  // (one TLS load) rather than kept live across the hit path.
  inline int Miss(int code, std::atomic<uint64_t> Stripe::*counter);
  __attribute__((always_inline)) inline int LookupHit(Region* r, uintptr_t a, size_t len, int d,
                                                     rdmalloc_keys* out);
  // A lookup under a pd other than NULL.
  __attribute__((noinline)) int LookupInDomain(uintptr_t a, size_t len, ibv_pd* pd,
                                               rdmalloc_keys* out);
  // Everything but a hit: the radix map's answer, checked under the region's
  // seq; misses, retries and registration (LookupSlow) from here. Static (it
  // finds g_heap itself): the hit path then keeps no heap pointer live, and
  // saves no register.
  __attribute__((noinline)) static int LookupRegion(uintptr_t a, size_t len, int d,
                                                    rdmalloc_keys* out);
  inline int LookupRegionIn(uintptr_t a, size_t len, int d, rdmalloc_keys* out);
  // A miss once addr is known: EINVAL if [a, a+len) wraps the address space
  // (which the hit path never checks), else `code`.
  __attribute__((noinline)) int MissOutside(uintptr_t a, size_t len, int code = RDMALLOC_ENOTOURS,
                                            std::atomic<uint64_t> Stripe::*counter = &Stripe::not_ours);

  // The request (addr, len, domain) is in *out: LookupRegion wrote it there
  // before it found no usable registration.
  __attribute__((noinline)) int LookupSlow(rdmalloc_keys* out);
  __attribute__((noinline)) int ServeRegistrationSlow(ibv_pd* pd, const void* addr, size_t len,
                                                      int access, Served* out);
  __attribute__((noinline)) int LookupFirstOnThread(const void* addr, size_t len, ibv_pd* pd,
                                                    rdmalloc_keys* out);
  inline void FillKeys(Region* r, int d, uintptr_t a, size_t len, uint32_t lkey, uint32_t rkey,
                       uint32_t step_shift, void* handle, int access, rdmalloc_keys* out) const;
  int EnsureBackend() { return regs_.EnsureBackend(); }

  // Registration of whole regions; r->reg_lock held.
  void RegisterEverywhere(Region* r);
  void RegisterAllLive(int d);
  // The release of an empty region: whoever holds its reg_lock when it is
  // wanted (release_wanted) takes it over, so hook context never waits for a
  // registration that may itself be inside malloc. The hooks and the
  // give-back calls perform it (UnlockAndRelease); the calls that find keys,
  // register, move bytes or scan hand it to the release thread
  // (UnlockAndQueueRelease): a lookup does no release work.
  void UnlockAndRelease(Region* r);
  void UnlockAndQueueRelease(Region* r);
  void Release(Region* r);
  enum class ReleaseBy { kCaller, kReleaseThread };
  void RunRelease(Region* r, ReleaseBy by);
  bool ReleaseLocked(Region* r);
  static void FinishQueued(Region* r, void* heap);

  // Purges free resident pages of unregistered regions (PurgeFree skips held
  // ones) until `budget` bytes are purged. Waits for a region's reg_lock only
  // if `may_wait` (API context); in hook context a busy region is skipped.
  uint64_t PurgeFreePages(uint64_t budget, bool may_wait,
                          PageMap::Which which = PageMap::Which::kResident);

  void InstallForkHandlers();
  void ForkChild();

  // The heap lives in .bss, so each page of it a program touches costs a
  // page fault (12-16 us on this machine): the rooms a program's start
  // writes come first, together, and the region store's own start-up state
  // follows its tables (RegionStore). A malloc(100) program touches 3 pages
  // of the heap (one of them a home slot of the region map), where it
  // touched 6.
  ConfigSlot config_;
  Registrations regs_;
  ReleasePipeline release_;
  std::atomic<uint64_t> lookup_reg_failed_{0}, lookup_slow_{0}, foreign_extents_{0};
  std::atomic<int64_t> forwarded_on_heap_{0};
  RegionStore store_;
  Stripe stripes_[kStripes];
};

// Each thread bumps its own stripe of the lookup counter: no shared cache
// line on the lookup path (threads beyond kStripes share stripes). nullptr
// until the thread's first lookup or served MR. __thread, not thread_local:
// no TLS wrapper function across translation units.
extern __thread LookupStripe* t_stripe
    __attribute__((tls_model("initial-exec"), visibility("hidden")));

extern __attribute__((visibility("hidden"))) Heap g_heap;
inline Heap& TheHeap() { return g_heap; }

inline int Heap::Miss(int code, std::atomic<uint64_t> Stripe::*counter) {
  return Fail(code, t_stripe->*counter);
}

inline Heap::Stripe& Heap::MyStripe() {
  Stripe* stripe = t_stripe;
  return *(__builtin_expect(stripe != nullptr, 1) ? stripe : AssignStripe());
}

inline void Heap::FillKeys(Region* r, int d, uintptr_t a, size_t len, uint32_t lkey, uint32_t rkey,
                           uint32_t step_shift, void* handle, int access,
                           rdmalloc_keys* out) const {
  uintptr_t base = r->begin();
  uint32_t step = static_cast<uint32_t>((a - base) >> step_shift);
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

// The hit path is a leaf: no call but tail calls (a thread's first lookup, a
// pd, every miss and every retry go elsewhere). It reads one cache line, the
// slot of the region the region map's guess names: the slot holds the region's range
// with its keys, under its own seq. Keys go straight to *out and are checked
// afterwards (a seqlock read): when the check fails, LookupRegion overwrites
// them.
__attribute__((always_inline)) inline int Heap::Lookup(const void* addr, size_t len, ibv_pd* pd,
                                                       rdmalloc_keys* out) {
  Stripe* stripe = t_stripe;
  if (__builtin_expect(stripe == nullptr, 0)) return LookupFirstOnThread(addr, len, pd, out);
  Bump(stripe->lookups);
  if (out == nullptr) return Miss(RDMALLOC_EINVAL, &Stripe::einval);
  uintptr_t a = reinterpret_cast<uintptr_t>(addr);
  if (__builtin_expect(pd != nullptr, 0)) return LookupInDomain(a, len, pd, out);
  return LookupHit(store_.Guess(a), a, len, 0, out);
}

// The pairs LookupHit copies (CopyUnderSeq) lie side by side in both.
static_assert(offsetof(RegSlot, size) == offsetof(RegSlot, base) + 8 &&
                  offsetof(RegSlot, handle) == offsetof(RegSlot, mr) + 8 &&
                  offsetof(RegSlot, rkey) == offsetof(RegSlot, lkey) + 4 &&
                  offsetof(RegSlot, access) == offsetof(RegSlot, step_shift) + 4,
              "RegSlot's pairs");
static_assert(offsetof(rdmalloc_keys, rkey) == offsetof(rdmalloc_keys, lkey) + 4 &&
                  offsetof(rdmalloc_keys, handle) == offsetof(rdmalloc_keys, mr) + 8 &&
                  offsetof(rdmalloc_keys, region_len) == offsetof(rdmalloc_keys, region_base) + 8,
              "rdmalloc_keys' pairs");

// r is the region map's guess for a, maybe wrong (or reused since): the
// slot's own copy of the range decides. a + len is never formed, so a length
// that wraps the address space is just too long here.
__attribute__((always_inline)) inline int Heap::LookupHit(Region* r, uintptr_t a, size_t len,
                                                          int d, rdmalloc_keys* out) {
  if (r == nullptr) return LookupRegion(a, len, d, out);
  RegSlot& s = r->reg[d];
  uint32_t q = s.seq.load(std::memory_order_acquire);
  struct {
    uintptr_t base;
    size_t size;  // 0 unless registered
  } range;
  CopyUnderSeq<16>(&range, &s.base);
  size_t offset = a - range.base;  // a < base wraps around to offset >= size
  if (offset >= range.size || len > range.size - offset) return LookupRegion(a, len, d, out);
  uint32_t keys[2], step_shift_access[2];
  CopyUnderSeq<8>(keys, &s.lkey);
  CopyUnderSeq<8>(step_shift_access, &s.step_shift);
  uint32_t step = static_cast<uint32_t>(offset >> step_shift_access[0]);
  keys[0] += step;
  keys[1] += step;
  __builtin_memcpy(&out->lkey, keys, 8);
  CopyUnderSeq<16>(&out->mr, &s.mr);
  __builtin_memcpy(&out->region_base, &range, 16);
  out->addr = reinterpret_cast<const void*>(a);
  out->len = len;
  out->reg_errno = 0;
  out->domain = d;
  out->access = static_cast<int>(step_shift_access[1]);
  std::atomic_thread_fence(std::memory_order_acquire);
  // Read while a writer was at work (q odd), it can never equal q & ~1: seq
  // only grows. So this one compare also rejects a torn read, which did no
  // harm meanwhile (no pointer read from the slot was followed).
  if (__builtin_expect(s.seq.load(std::memory_order_relaxed) != (q & ~1u), 0))
    return LookupRegion(a, len, d, out);
  return RDMALLOC_OK;
}

// A registered region, a known pd and rights the registration has: read
// like a lookup hit (the pd's slot only: its seq, its copy of the region's
// range, its keys), then held, then the slot's seq checked again. A slot is
// registered only while its region is live and deregistered (its seq moved)
// before the region is released or its descriptor reused, so an unchanged
// seq proves the hold landed on the region the keys belong to.
__attribute__((always_inline)) inline int Heap::ServeRegistration(ibv_pd* pd, const void* addr,
                                                                  size_t len, int access,
                                                                  Served* out) {
  uintptr_t a = reinterpret_cast<uintptr_t>(addr);
  int d = regs_.DomainIndex(pd);
  // A wrong guess fails the range check below: the slow path asks the map.
  Region* r = d > 0 && regs_.verbs_chosen() ? store_.Guess(a) : nullptr;
  if (r == nullptr) return ServeRegistrationSlow(pd, addr, len, access, out);
  RegSlot& s = r->reg[d];
  uint32_t q = s.seq.load(std::memory_order_acquire);
  uintptr_t base = s.base.load(std::memory_order_relaxed);
  size_t size = s.size.load(std::memory_order_relaxed);
  size_t offset = a - base;  // a < base wraps around to offset >= size
  if (!(q & 1) && offset < size && len <= size - offset &&  // size 0 unless registered
      (access & ~s.access.load(std::memory_order_relaxed)) == 0) {
    uint32_t step = static_cast<uint32_t>(offset >> s.step_shift.load(std::memory_order_relaxed));
    out->lkey = s.lkey.load(std::memory_order_relaxed) + step;
    out->rkey = s.rkey.load(std::memory_order_relaxed) + step;
    out->region_mr = static_cast<const ibv_mr*>(s.mr.load(std::memory_order_relaxed));
    out->region = r;
    if (store_.Hold(r)) {  // sequentially consistent: the load below comes after it
      if (s.seq.load(std::memory_order_relaxed) == q) return RDMALLOC_OK;
      DropHold(r);
    }
  }
  return ServeRegistrationSlow(pd, addr, len, access, out);
}

}  // namespace rdmalloc

#endif  // RDMALLOC_ALLOCATOR_HEAP_H_
