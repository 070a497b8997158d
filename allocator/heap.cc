#include "allocator/heap.h"

#include <errno.h>
#include <sys/mman.h>

#include <cstring>

#include "allocator/fork.h"
#include "allocator/log.h"

namespace rdmalloc {

// malloc runs before any constructor, so the heap must be constant-initialised:
// a dynamic initialiser would wipe the regions made by earlier allocations.
// gcc evaluates it; clang gives up at its default constexpr step limit
// (raise it with -fconstexpr-steps=16777216) and must not silently fall back.
// On a page boundary, so that the state a program's start writes lies on
// as few pages as heap.h's member order allows (3, one a region map slot);
// at the offset the linker chose, an earlier layout took one more. (clang wants
// alignas before the attribute.) In .lbss, after .bss: aligned there, it
// made all of .bss start on a page of its own, and crtstuff's flag first in
// .bss cost two page faults at exit (test/packaging_test.sh).
alignas(kPageSize)
#if defined(__clang__)
__attribute__((require_constant_initialization))
#endif
__attribute__((section(".lbss.rdmalloc_heap"))) Heap g_heap;

namespace {
std::atomic<unsigned> g_next_stripe{0};
}  // namespace

// The model again: GCC takes it from the definition, and without it this
// file reached t_stripe through __tls_get_addr.
__thread LookupStripe* t_stripe __attribute__((tls_model("initial-exec"), visibility("hidden"))) =
    nullptr;

Heap::Stripe* Heap::AssignStripe() {
  t_stripe = &stripes_[g_next_stripe.fetch_add(1, std::memory_order_relaxed) % kStripes];
  return t_stripe;
}

void Heap::Configure(const Config& config) {
  config_.Set(config);
  SetLogLevel(config.verbose);
  store_.set_region_size(config.region_size);
  store_.set_retain(config.retain);
  store_.set_huge_pages(config.huge_pages != 0);
  regs_.Configure(config_.get());
  regs_.set_opened([](void* heap) { static_cast<Heap*>(heap)->RegisterAllLive(0); }, this);
  release_.set_finish(FinishQueued, this);
}

void Heap::Start() {
  InstallForkHandlers();
  regs_.ChooseBackend();
  // Eager registration starts at once; otherwise the backend opens at first
  // use (with RDMALLOC_VERBOSE now, so that the start-up line names it;
  // verbs still at first use).
  if (regs_.eager() || (config().verbose > 0 && !regs_.verbs_chosen())) EnsureBackend();
}

// ------------------------------------------------------------------ hooks

void* Heap::AllocExtent(unsigned arena, unsigned access_class, void* new_addr, size_t size,
                        size_t alignment, bool* zero) {
  RegionStore::Extent e;
  if (!store_.Carve(arena, access_class, new_addr, size, alignment, &e)) return nullptr;
  if (e.fresh) {
    Region* r = e.region;
    Log(2, "new region %p+%zu%s, access class %u, arena %u", reinterpret_cast<void*>(r->begin()),
        r->length(), r->dedicated ? " (dedicated)" : "", access_class, arena);
    // Eager registration, in hook context: TryLock only (hook context never
    // waits on reg_lock). It fails only while a scan of every region (a pd
    // added or removed, a dump) holds it; the first lookup registers then.
    if (regs_.eager() && regs_.backend_ready() && r->reg_lock.TryLock()) {
      RegisterEverywhere(r);
      UnlockAndRelease(r);
    }
  }
  // Retained pages do not add to the peak: as many as this extent will
  // fault in are purged elsewhere (unregistered, unheld, never waiting, never
  // under observers), since the request could not use them. Only for large
  // extents, where the scan of the regions is cheap beside the faults.
  // Not while the shard's large blocks are sparse: most of their new pages
  // are never touched, and the retained ones are what they do touch.
  if (e.new_pages >= kMatchedNewPages && store_.retained_bytes() != 0 && !release_.observed() &&
      !store_.LargeBlocksSparse(e.region))
    PurgeFreePages(uint64_t{e.new_pages} << kPageShift, /*may_wait=*/false);
  // Freed pages of a registered region are never purged, so they may hold
  // old bytes; jemalloc asked for zeroes or is told the truth.
  if (*zero && e.dirty) memset(e.addr, 0, size);
  else if (!*zero) *zero = !e.dirty;
  return e.addr;
}

void Heap::FreeExtent(Region* r, void* addr, size_t size, Freed how, PageMap::Block held) {
  // Freed pages stay resident for reuse while what rdmalloc keeps stays
  // within RDMALLOC_RETAIN. Past it, an unregistered region that no memory
  // registration of the program's holds gives the excess back to the OS as
  // jemalloc would: the extent's tail, so that what the bound allows stays
  // resident (a loop over large blocks reuses it without page faults). A
  // cold extent is all excess: kept again, it would stack on what jemalloc
  // keeps dirty (mstress peaked at 1.15x jemalloc's RSS). Under
  // reg_lock, so no registration can pin them meanwhile (if the lock is
  // busy, a registration is under way and the pages simply stay). With
  // observers nothing is purged: another cache may have registered the pages
  // itself, and it only hears of whole regions (see AddObserver).
  // Of a sparse large block only its resident head is kept (EndLargeBlock);
  // the rest comes back untouched (PageMap::GiveUntouched): not counted as
  // kept, so it forces no purge of the heads a loop over such blocks reuses,
  // and not purged here: a madvise per block freed page tables that the next
  // block faulted back, 2x slower than leaving it to the sweep below.
  unsigned shard = store_.EnterFree(r);
  bool pinned = r->registrations.load() != 0;
  bool may_purge = !release_.observed() && !pinned;
  // Before any purge below, which would read as pages never touched.
  size_t keep = size;
  if (held != PageMap::Block::kSmall)
    keep = store_.EndLargeBlock(r, addr, size, held, how == Freed::kWarm && may_purge, pinned);
  size_t excess = how == Freed::kCold ? size : store_.ExcessOverRetain(keep);
  if (excess != 0) excess += size - keep;  // the tail: untouched pages first
  size_t purged = 0;
  if (excess != 0 && may_purge && r->reg_lock.TryLock()) {
    if (r->registrations.load() == 0 && r->mr_holds.load() == 0) {
      size_t tail = (excess + kPageSize - 1) & ~(kPageSize - 1);
      if (tail > size) tail = size;
      if (madvise(static_cast<char*>(addr) + (size - tail), tail, MADV_DONTNEED) == 0)
        purged = tail;
    }
    UnlockAndRelease(r);
  }
  if (store_.Give(r, addr, size, purged, keep) == RegionStore::Gave::kEmpty) Release(r);
  // Registered or observed free pages cannot be purged: past the bound,
  // kept empty regions of this shard go instead.
  while (Region* kept = store_.ShedKept(shard)) Release(kept);
  // Pages nobody took for a whole idle epoch, and the untouched pages (so
  // that any a program did touch past a sparse block's head are not kept
  // longer); as above, never under observers and never waiting for a
  // registration.
  uint64_t idle = 0, now = NowNs();
  if (store_.EndIdleEpoch(now, kIdleEpochNs, &idle) && idle != 0 && !release_.observed())
    PurgeFreePages(idle << kPageShift, /*may_wait=*/false);
  if (store_.untouched_bytes() != 0 && !release_.observed() && store_.SweepDue(now, kSweepNs, kSweepGives))
    PurgeFreePages(UINT64_MAX, /*may_wait=*/false, PageMap::Which::kUntouched);
  store_.LeaveFree(shard);
}

uint64_t Heap::PurgeFreePages(uint64_t budget, bool may_wait, PageMap::Which which) {
  uint64_t purged = 0;
  size_t used = store_.descriptors_used();
  for (size_t i = 0; i < used && purged < budget; i++) {
    Region* r = store_.descriptor(i);
    uint64_t seq = r->seq.load();
    if (!(seq & 1) || r->registrations.load() != 0) continue;
    if (may_wait) r->reg_lock.Lock();
    else if (!r->reg_lock.TryLock()) continue;
    if (r->registrations.load() == 0) purged += store_.PurgeFree(r, seq, budget - purged, which);
    UnlockAndRelease(r);
  }
  return purged;
}

void Heap::GiveBackRetained() {
  while (Region* kept = store_.TakeKept()) Release(kept);
  if (release_.observed()) return;  // observers may hold MRs on free pages
  PurgeFreePages(UINT64_MAX, /*may_wait=*/true, PageMap::Which::kAll);
}

// ---------------------------------------------------------------- release

// Deregisters every domain and returns true: the caller then drops reg_lock
// and unmaps. Returns false if the release is queued for the release thread
// instead: observers must hear of it (callbacks run there only), or a backend
// that mallocs must deregister (never in hook context).
bool Heap::ReleaseLocked(Region* r) {
  if (release_.observed() || (r->registrations.load() > 0 && !regs_.hook_safe())) {
    release_.Queue(r);
    return false;
  }
  regs_.DeregisterAll(r);
  return true;
}

void Heap::RunRelease(Region* r, ReleaseBy by) {
  while (r->release_wanted.load() && r->reg_lock.TryLock()) {
    if (!r->release_wanted.exchange(false)) {
      r->reg_lock.Unlock();
      continue;
    }
    if (by == ReleaseBy::kReleaseThread) {
      release_.Queue(r);
      r->reg_lock.Unlock();
      release_.EnsureThread(false);  // API context: it may start the thread
      return;
    }
    bool done = ReleaseLocked(r);
    r->reg_lock.Unlock();
    if (done) {
      Log(2, "released region %p+%zu", reinterpret_cast<void*>(r->begin()), r->length());
      store_.Unmap(r);
    }
    return;
  }
}

void Heap::UnlockAndRelease(Region* r) {
  r->reg_lock.Unlock();
  RunRelease(r, ReleaseBy::kCaller);
}

void Heap::UnlockAndQueueRelease(Region* r) {
  r->reg_lock.Unlock();
  RunRelease(r, ReleaseBy::kReleaseThread);
}

void Heap::Release(Region* r) {
  r->release_wanted.store(true);
  RunRelease(r, ReleaseBy::kCaller);
}

// On the release thread. Deregister first, then notify, then unmap: the
// observers drop their entries while the addresses are still ours, so no new
// mapping can appear there before they did.
void Heap::FinishQueued(Region* r, void* heap) {
  Heap* h = static_cast<Heap*>(heap);
  r->reg_lock.Lock();
  h->regs_.DeregisterAll(r);
  r->reg_lock.Unlock();
  h->release_.Notify(r->begin(), r->length());
  Log(2, "released region %p+%zu", reinterpret_cast<void*>(r->begin()), r->length());
  h->store_.Unmap(r);
}

int Heap::AddObserver(rdmalloc_release_fn fn, void* arg) {
  return release_.AddObserver(
      fn, arg, [](void* store) { return static_cast<RegionStore*>(store)->FreesUnderWay(); },
      &store_);
}

// ---------------------------------------------------------- registration

void Heap::RegisterEverywhere(Region* r) {
  for (int d = 0; d < kMaxDomains; d++) {
    if (regs_.open(d) && r->reg[d].state.load() != RegSlot::kRegistered) regs_.Register(r, d);
  }
}

void Heap::RegisterAllLive(int d) {
  size_t used = store_.descriptors_used();
  for (size_t i = 0; i < used; i++) {
    Region* r = store_.descriptor(i);
    if (!(r->seq.load() & 1)) continue;
    r->reg_lock.Lock();
    if ((r->seq.load() & 1) && r->reg[d].state.load() != RegSlot::kRegistered)
      regs_.Register(r, d);
    UnlockAndQueueRelease(r);
  }
}

int Heap::LookupFirstOnThread(const void* addr, size_t len, ibv_pd* pd, rdmalloc_keys* out) {
  AssignStripe();
  return Lookup(addr, len, pd, out);
}

int Heap::LookupInDomain(uintptr_t a, size_t len, ibv_pd* pd, rdmalloc_keys* out) {
  int d = regs_.DomainIndex(pd);
  if (d < 0) return Miss(RDMALLOC_EINVAL, &Stripe::einval);
  return LookupHit(store_.Guess(a), a, len, d, out);
}

int Heap::LookupRegion(uintptr_t a, size_t len, int d, rdmalloc_keys* out) {
  return TheHeap().LookupRegionIn(a, len, d, out);
}

int Heap::LookupRegionIn(uintptr_t a, size_t len, int d, rdmalloc_keys* out) {
  Region* r = store_.Find(a);
  if (r == nullptr) return MissOutside(a, len);
  uint64_t seq = r->seq.load(std::memory_order_acquire);
  uintptr_t base = r->begin();
  size_t size = r->length();
  // a < base wraps around to a - base >= size.
  if (!(seq & 1) || a - base >= size) return MissOutside(a, len);
  if (len > size - (a - base)) return MissOutside(a, len, RDMALLOC_ECROSS, &Stripe::cross);
  out->addr = reinterpret_cast<const void*>(a);  // the request, for LookupSlow
  out->len = len;
  out->domain = d;
  RegSlot& s = r->reg[d];
  uint32_t q = s.seq.load(std::memory_order_acquire);
  if (!(q & 1) && s.state.load(std::memory_order_relaxed) == RegSlot::kRegistered) {
    FillKeys(r, d, a, len, s.lkey.load(std::memory_order_relaxed),
             s.rkey.load(std::memory_order_relaxed), s.step_shift.load(std::memory_order_relaxed),
             s.handle.load(std::memory_order_relaxed), s.access.load(std::memory_order_relaxed),
             out);
    std::atomic_thread_fence(std::memory_order_acquire);
    if (s.seq.load(std::memory_order_relaxed) == q && r->seq.load(std::memory_order_relaxed) == seq)
      return RDMALLOC_OK;
  }
  return LookupSlow(out);
}

int Heap::MissOutside(uintptr_t a, size_t len, int code, std::atomic<uint64_t> Stripe::*counter) {
  if (len > UINTPTR_MAX - a) return Miss(RDMALLOC_EINVAL, &Stripe::einval);
  return Miss(code, counter);
}

int Heap::LookupSlow(rdmalloc_keys* out) {
  uintptr_t a = reinterpret_cast<uintptr_t>(out->addr);
  size_t len = out->len;
  int d = out->domain;
  lookup_slow_.fetch_add(1, std::memory_order_relaxed);
  EnsureBackend();
  EnsureReleaseThread();  // a registration on verbs will need it for its release
  Region* r = store_.Find(a);
  if (r == nullptr) return Fail(RDMALLOC_ENOTOURS, MyStripe().not_ours);
  r->reg_lock.Lock();
  if (!(r->seq.load() & 1) || !r->Contains(a, 1)) {
    UnlockAndQueueRelease(r);
    return Fail(RDMALLOC_ENOTOURS, MyStripe().not_ours);
  }
  if (!r->Contains(a, len)) {
    UnlockAndQueueRelease(r);
    return Fail(RDMALLOC_ECROSS, MyStripe().cross);
  }
  if (d != 0 && !regs_.open(d)) {
    UnlockAndQueueRelease(r);
    return Fail(RDMALLOC_EINVAL, MyStripe().einval);
  }
  RegSlot& s = r->reg[d];
  int err = s.state.load() == RegSlot::kRegistered ? 0 : regs_.Register(r, d);
  if (err == ENODEV && d != 0) {  // the pd is being removed right now: unknown pd
    UnlockAndQueueRelease(r);
    return Fail(RDMALLOC_EINVAL, MyStripe().einval);
  }
  if (err != 0) {
    UnlockAndQueueRelease(r);
    memset(out, 0, sizeof *out);
    out->reg_errno = err;
    out->domain = d;
    errno = err;
    return Fail(RDMALLOC_EREGFAIL, lookup_reg_failed_);
  }
  FillKeys(r, d, a, len, s.lkey.load(), s.rkey.load(), s.step_shift.load(), s.handle.load(),
           s.access.load(), out);
  UnlockAndQueueRelease(r);
  return RDMALLOC_OK;
}

// ------------------------------------------- the program's registrations

// Whatever the inline path could not serve: a pd seen for the first time, a
// region not yet registered on it, or a race with a release.
int Heap::ServeRegistrationSlow(ibv_pd* pd, const void* addr, size_t len, int access,
                                Served* out) {
  if (pd == nullptr || !regs_.verbs_chosen()) return RDMALLOC_ENOTSUP;
  // Whether it can be served at all, before anything is registered for it.
  Region* r = store_.RegionOf(addr, len);
  if (r == nullptr) return RDMALLOC_ENOTOURS;  // not heap, or crossing regions
  int d = regs_.DomainIndex(pd);
  if ((access & ~regs_.RegionAccess(r, d, config().access)) != 0)
    return RDMALLOC_ENOTSUP;  // rights beyond the region's
  if (d < 0) {
    // A pd seen for the first time: the heap is registered on it with the
    // plain heap's rights, as rdmalloc_add_pd would.
    int rc = AddDomain(pd, config().access);
    if (rc != RDMALLOC_OK && regs_.DomainIndex(pd) < 0) return rc;
  }
  rdmalloc_keys keys;
  int rc = Lookup(addr, len, pd, &keys);
  if (rc != RDMALLOC_OK) return rc;
  if ((access & ~keys.access) != 0) return RDMALLOC_ENOTSUP;
  if (store_.Find(reinterpret_cast<uintptr_t>(addr)) != r) return RDMALLOC_ENOTOURS;
  // Registered, so never purged: the hold needs no reg_lock. It only keeps
  // the region from release, and only as it was looked up (it may have been
  // released meanwhile if the program registers memory it does not own).
  if (!store_.Hold(r)) return RDMALLOC_ENOTOURS;
  RegSlot& slot = r->reg[keys.domain];
  if (r->begin() != reinterpret_cast<uintptr_t>(keys.region_base) ||
      slot.state.load() != RegSlot::kRegistered || slot.lkey.load() != keys.lkey) {
    DropHold(r);
    return RDMALLOC_ENOTOURS;
  }
  out->lkey = keys.lkey;
  out->rkey = keys.rkey;
  out->region_mr = keys.mr;
  out->region = r;
  return RDMALLOC_OK;
}

size_t Heap::HoldRange(const void* addr, size_t len, Region** held, size_t max) {
  uintptr_t a = reinterpret_cast<uintptr_t>(addr);
  if (len == 0 || len > UINTPTR_MAX - a) return 0;
  size_t count = 0;
  uintptr_t end = a + len;
  // Each region is chunk-aligned: one probe per chunk finds every one.
  for (uintptr_t c = a & ~(kChunkSize - 1); c < end && count < max; c += kChunkSize) {
    Region* r = store_.Find(c < a ? a : c);
    if (r == nullptr || (count > 0 && held[count - 1] == r)) continue;
    // Under reg_lock: the dalloc hook's purge of an unregistered region
    // checks the holds under it, so no purge can pass this hold unseen.
    r->reg_lock.Lock();
    bool ok = store_.Hold(r);
    UnlockAndQueueRelease(r);
    if (ok) held[count++] = r;
  }
  return count;
}

int Heap::AddDomain(ibv_pd* pd, int access) {
  EnsureBackend();
  EnsureReleaseThread();
  LockGuard g(regs_.lock());
  int slot = 0;
  int rc = regs_.AddDomain(pd, access, &slot);
  if (rc == RDMALLOC_OK && regs_.eager()) RegisterAllLive(slot);
  return rc;
}

int Heap::RemoveDomain(ibv_pd* pd) {
  LockGuard g(regs_.lock());
  int d = 0;
  int rc = regs_.BeginRemove(pd, &d);
  if (rc != RDMALLOC_OK) return rc;
  size_t used = store_.descriptors_used();
  for (size_t i = 0; i < used; i++) {
    Region* r = store_.descriptor(i);
    r->reg_lock.Lock();
    regs_.Deregister(r, d);
    UnlockAndQueueRelease(r);
  }
  regs_.FinishRemove(d);
  return RDMALLOC_OK;
}

int Heap::Dma(const rdmalloc_keys* k, size_t off, void* buf, size_t n, bool to_memory) {
  if (k == nullptr || (buf == nullptr && n != 0) || off > k->len || n > k->len - off ||
      k->domain < 0 || k->domain >= kMaxDomains)
    return RDMALLOC_EINVAL;
  if (n == 0) return RDMALLOC_OK;
  uintptr_t a = reinterpret_cast<uintptr_t>(k->addr) + off;
  Region* r = store_.Find(a);
  if (r == nullptr) return RDMALLOC_ENOTOURS;
  r->reg_lock.Lock();
  int rc = RDMALLOC_ENOTOURS;
  if ((r->seq.load() & 1) && r->Contains(a, n) &&
      r->begin() == reinterpret_cast<uintptr_t>(k->region_base))
    rc = regs_.Dma(r, k->domain, a, buf, n, to_memory);
  UnlockAndQueueRelease(r);
  return rc;
}

// ------------------------------------------------------------------ stats

int Heap::Stats(struct rdmalloc_stats* out, size_t size) {
  if (out == nullptr || size < 2 * sizeof(uint32_t)) return RDMALLOC_EINVAL;
  EnsureReleaseThread();
  struct rdmalloc_stats s;
  memset(&s, 0, sizeof s);
  s.version = RDMALLOC_STATS_VERSION;
  s.size = static_cast<uint32_t>(size < sizeof s ? size : sizeof s);
  auto get = [](const std::atomic<uint64_t>& v) { return v.load(std::memory_order_relaxed); };
  s.regions_created = store_.regions_created();
  s.regions_released = store_.regions_released();
  s.regions_live = s.regions_created - s.regions_released;
  s.bytes_in_use = store_.bytes_in_use();
  s.bytes_mapped = store_.bytes_mapped();
  s.heap_lock_waits = store_.shard_lock_waits();
  s.bytes_retained = store_.retained_bytes();
  s.releases_held_by_mrs = store_.releases_held();
  int64_t on_heap = forwarded_on_heap_.load(std::memory_order_relaxed);
  s.mrs_forwarded_on_heap = on_heap > 0 ? static_cast<uint64_t>(on_heap) : 0;
  regs_.FillStats(&s);
  uint64_t served_gone = 0;
  for (const Stripe& st : stripes_) {
    s.lookups += get(st.lookups);
    s.lookup_not_ours += get(st.not_ours);
    s.lookup_cross += get(st.cross);
    s.lookup_einval += get(st.einval);
    s.mrs_served += get(st.mrs_served);
    s.mrs_forwarded += get(st.mrs_forwarded);
    served_gone += get(st.mrs_served_gone);
  }
  // Read stripe by stripe while threads count: never report a negative.
  s.mrs_live = s.mrs_served > served_gone ? s.mrs_served - served_gone : 0;
  s.lookup_reg_failed = get(lookup_reg_failed_);
  s.lookup_slow = get(lookup_slow_);
  s.foreign_extents = get(foreign_extents_);
  s.releases_deferred = release_.deferred();
  s.releases_notified = release_.notified();
  s.observers = release_.observers();
  s.releases_pending = release_.pending();
  memcpy(out, &s, s.size);
  return RDMALLOC_OK;
}

int Heap::VisitRegions(void (*visit)(const RegionInfo& info, void* ctx), void* ctx) {
  size_t used = store_.descriptors_used();
  int count = 0;
  for (size_t i = 0; i < used; i++) {
    Region* r = store_.descriptor(i);
    // Copy under the locks, visit after: the visitor may allocate.
    RegionInfo info;
    r->reg_lock.Lock();
    bool live = store_.ReadPages(r, &info.pages, &info.pages_in_use);
    if (live) {
      info.base = r->begin();
      info.size = r->length();
      info.dedicated = r->dedicated;
      info.access_class = r->access_class;
      for (int d = 0; d < kMaxDomains; d++) {
        info.reg[d] = {r->reg[d].state.load(), r->reg[d].lkey.load(), r->reg[d].rkey.load()};
      }
    }
    UnlockAndQueueRelease(r);
    if (!live) continue;
    visit(info, ctx);
    count++;
  }
  return count;
}

int Heap::DumpRegions(FILE* out) {
  if (out == nullptr) return RDMALLOC_EINVAL;
  int count = VisitRegions(
      [](const RegionInfo& r, void* ctx) {
        FILE* out = static_cast<FILE*>(ctx);
        fprintf(out, "region %p-%p %8zu KiB  used %5.1f%%%s", reinterpret_cast<void*>(r.base),
                reinterpret_cast<void*>(r.base + r.size), r.size >> 10,
                r.pages != 0 ? 100.0 * r.pages_in_use / r.pages : 0.0,
                r.dedicated ? "  dedicated" : "");
        if (r.access_class != 0) fprintf(out, "  class %s", ClassRightsName(r.access_class));
        for (int d = 0; d < kMaxDomains; d++) {
          if (r.reg[d].state == RegSlot::kRegistered)
            fprintf(out, "  domain %d: lkey %u rkey %u", d, r.reg[d].lkey, r.reg[d].rkey);
          else if (r.reg[d].state == RegSlot::kFailed)
            fprintf(out, "  domain %d: registration failed", d);
        }
        fputc('\n', out);
      },
      out);
  fflush(out);
  return count;
}

// ------------------------------------------------------------------- fork

// The heap's stages of the fork protocol, one per rank it holds locks at.
// reg_lock (kRegion) is not taken: it guards registrations, which the child
// forgets, and no hook waits for it; the child resets every one.
void Heap::InstallForkHandlers() {
  ForkHandlers api;
  api.prepare = [] { g_heap.regs_.lock().Lock(); };
  api.parent = [] { g_heap.regs_.lock().Unlock(); };
  api.child = [] { g_heap.ForkChild(); };
  SetForkHandlers(LockRank::kApi, api);
  ForkHandlers observers;
  observers.prepare = [] { g_heap.release_.observer_lock().Lock(); };
  observers.parent = [] { g_heap.release_.observer_lock().Unlock(); };
  observers.child = [] { g_heap.release_.observer_lock().ResetAfterFork(); };
  SetForkHandlers(LockRank::kObservers, observers);
  ForkHandlers heap;
  heap.prepare = [] { g_heap.store_.LockAllForFork(); };
  heap.parent = [] { g_heap.store_.UnlockAllAfterFork(); };
  heap.child = [] { g_heap.store_.ResetAfterFork(); };
  SetForkHandlers(LockRank::kHeap, heap);
  ForkHandlers queue;
  queue.prepare = [] { g_heap.release_.queue_lock().Lock(); };
  queue.parent = [] { g_heap.release_.queue_lock().Unlock(); };
  queue.child = [] { g_heap.release_.ResetAfterFork(); };
  SetForkHandlers(LockRank::kReleaseQueue, queue);
}

// Registrations are the parent's kernel objects: forget them, do not undo them.
void Heap::ForkChild() {
  t_stripe = nullptr;  // the child's first lookup restarts rdmalloc (allocator/api.cc)
  regs_.ForgetAfterFork();
  size_t used = store_.descriptors_used();
  for (size_t i = 0; i < used; i++) {
    Region* r = store_.descriptor(i);
    r->reg_lock.ResetAfterFork();
    for (RegSlot& s : r->reg) {
      s.state.store(RegSlot::kNone, std::memory_order_relaxed);
      s.size.store(0, std::memory_order_relaxed);  // the hit path's only test of the state
      s.seq.store(0, std::memory_order_relaxed);
    }
    r->registrations.store(0, std::memory_order_relaxed);
  }
}

}  // namespace rdmalloc
