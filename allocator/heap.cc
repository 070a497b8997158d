#include "allocator/heap.h"

#include <errno.h>
#include <linux/futex.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <memory>

#include "allocator/fork.h"
#include "allocator/testing.h"
#include "verbs/uring_registrar.h"
#include "verbs/verbs_registrar.h"

namespace rdmalloc {
namespace {

static_assert(kMaxDomains == RDMALLOC_MAX_DOMAINS, "public and internal domain counts differ");
static_assert(kAccessLocalWrite == RDMALLOC_ACCESS_LOCAL_WRITE &&
                  kAccessRemoteWrite == RDMALLOC_ACCESS_REMOTE_WRITE &&
                  kAccessRemoteRead == RDMALLOC_ACCESS_REMOTE_READ &&
                  kAccessRemoteAtomic == RDMALLOC_ACCESS_REMOTE_ATOMIC &&
                  kAccessRelaxedOrdering == RDMALLOC_ACCESS_RELAXED_ORDERING,
              "access bits differ");
constexpr int kKnownAccess = RDMALLOC_ACCESS_LOCAL_WRITE | RDMALLOC_ACCESS_REMOTE_WRITE |
                             RDMALLOC_ACCESS_REMOTE_READ | RDMALLOC_ACCESS_REMOTE_ATOMIC |
                             RDMALLOC_ACCESS_RELAXED_ORDERING;


uint64_t NowNs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);  // vDSO: no system call
  return uint64_t(ts.tv_sec) * 1000000000u + uint64_t(ts.tv_nsec);
}


void* MapAligned(size_t bytes, size_t align) {
  size_t span = bytes + align;
  void* raw = mmap(nullptr, span, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (raw == MAP_FAILED) return nullptr;
  uintptr_t start = reinterpret_cast<uintptr_t>(raw);
  uintptr_t aligned = (start + align - 1) & ~(uintptr_t(align) - 1);
  if (aligned > start) munmap(raw, aligned - start);
  uintptr_t end = start + span, used_end = aligned + bytes;
  if (end > used_end) munmap(reinterpret_cast<void*>(used_end), end - used_end);
  return reinterpret_cast<void*>(aligned);
}

size_t RoundUp(size_t v, size_t to) { return (v + to - 1) & ~(to - 1); }

enum class BackendKind { kVerbs, kUring, kNone };
BackendKind g_kind = BackendKind::kNone;

testing::RegistrarWrapper g_registrar_wrapper = nullptr;

}  // namespace

void testing::SetRegistrarWrapper(RegistrarWrapper wrap) { g_registrar_wrapper = wrap; }

// malloc runs before any constructor, so the heap must be constant-initialised:
// a dynamic initialiser would wipe the regions made by earlier allocations.
// gcc evaluates it; clang gives up at its default constexpr step limit
// (raise it with -fconstexpr-steps=16777216) and must not silently fall back.
#if defined(__clang__)
__attribute__((require_constant_initialization))
#endif
Heap g_heap;

namespace {
std::atomic<unsigned> g_next_stripe{0};
}  // namespace

__thread unsigned t_stripe = ~0u;

unsigned AssignStripe() {
  t_stripe = g_next_stripe.fetch_add(1, std::memory_order_relaxed) % Heap::kStripes;
  return t_stripe;
}

void Heap::Log(int level, const char* format, ...) const {
  if (config_.verbose < level) return;
  char line[512];
  int n = snprintf(line, sizeof line, "rdmalloc[%d]: ", getpid());
  va_list ap;
  va_start(ap, format);
  int m = vsnprintf(line + n, sizeof line - n - 1, format, ap);
  va_end(ap);
  size_t len = static_cast<size_t>(n) + (m < 0 ? 0 : std::min<size_t>(m, sizeof line - n - 2));
  line[len++] = '\n';
  ssize_t ignored = write(STDERR_FILENO, line, len);
  (void)ignored;
}

void Heap::Configure(const Config& config) { config_ = config; }

void Heap::Start() {
  InstallForkHandlers();
  switch (config_.backend) {
    case BackendChoice::kVerbs: g_kind = BackendKind::kVerbs; break;
    case BackendChoice::kUring: g_kind = BackendKind::kUring; break;
    case BackendChoice::kNone: g_kind = BackendKind::kNone; break;
    case BackendChoice::kAuto:
      g_kind = CountRdmaDevices() > 0 ? BackendKind::kVerbs
               : UringProbe() == 0    ? BackendKind::kUring
                                      : BackendKind::kNone;
      break;
  }
  // Eager registration happens inside the alloc hook, so only a backend that
  // never mallocs can do it; ibverbs always registers on first lookup.
  if (config_.register_mode == RegisterMode::kEager) {
    if (g_kind == BackendKind::kUring) {
      EnsureBackend();
    } else {
      config_.register_mode = RegisterMode::kLazy;
      if (g_kind == BackendKind::kVerbs)
        Log(0, "RDMALLOC_REGISTER=eager needs the uring backend, and an RDMA device chose "
               "verbs; using lazy");
    }
  } else if (config_.verbose > 0 && g_kind != BackendKind::kVerbs) {
    EnsureBackend();  // so that the start-up line names the backend (verbs: at first use)
  }
}

int Heap::EnsureBackend() {
  if (backend_ready_.load(std::memory_order_acquire)) return backend_err_;
  SpinLockGuard g(api_lock_);
  if (backend_ready_.load(std::memory_order_relaxed)) return backend_err_;
  if (g_kind == BackendKind::kVerbs) {
    VerbsApi api;
    if (LoadVerbsApi(config_.verbs_library, &api) == 0) {
      registrar_ = MakeVerbsRegistrar(api, config_.device).release();
    } else {
      g_kind = UringProbe() == 0 ? BackendKind::kUring : BackendKind::kNone;
    }
  }
  if (g_kind == BackendKind::kUring) registrar_ = MakeUringRegistrar().release();
  if (registrar_ != nullptr && g_registrar_wrapper != nullptr)
    registrar_ = g_registrar_wrapper(registrar_);
  int err = ENODEV;
  if (registrar_ != nullptr) {
    if (Domain* dom = registrar_->OpenDomain(nullptr, config_.access, &err)) {
      domains_[0].access.store(config_.access, std::memory_order_relaxed);
      domains_[0].domain.store(dom, std::memory_order_release);
      domains_[0].state.store(DomainSlot::kOpen);
      err = 0;
    }
  }
  backend_err_ = err;
  backend_ready_.store(1, std::memory_order_release);
  Log(1, "backend %s (%s)%s, %s registration, regions up to %zu MiB%s",
      registrar_ != nullptr ? registrar_->name() : "none", DeviceDescription(),
      err != 0 ? ", default domain failed to open" : "",
      config_.register_mode == RegisterMode::kEager ? "eager" : "lazy", config_.region_size >> 20,
      config_.max_pinned != kNoPinLimit ? ", pinning capped" : "");
  if (err == 0 && config_.register_mode == RegisterMode::kEager) RegisterAllLive(0);
  return err;
}

const char* Heap::BackendName() {
  EnsureBackend();
  return registrar_ != nullptr ? registrar_->name() : "none";
}

const char* Heap::DeviceDescription() {
  EnsureBackend();
  if (registrar_ == nullptr) return "no backend: nothing is registered";
  if (g_kind == BackendKind::kUring)
    return config_.backend == BackendChoice::kAuto
               ? "no RDMA device found: pinning through io_uring"
               : "pinning through io_uring";
  return registrar_->device_name();
}

int Heap::DomainIndexSlow(ibv_pd* pd) const {
  for (int i = 1; i < kMaxDomains; i++) {
    if (domains_[i].pd.load(std::memory_order_acquire) == pd &&
        domains_[i].state.load(std::memory_order_acquire) == DomainSlot::kOpen)
      return i;
  }
  return -1;
}

// ---------------------------------------------------------------- page heap

Region* Heap::RegionOf(const void* addr, size_t size) const {
  uintptr_t a = reinterpret_cast<uintptr_t>(addr);
  Region* r = map_.Find(a);
  if (r == nullptr || !(r->seq.load(std::memory_order_acquire) & 1) || !r->Contains(a, size))
    return nullptr;
  return r;
}

bool Heap::CarveLocked(Region* r, size_t first, size_t n) {
  pages_in_use_.fetch_add(n, std::memory_order_release);
  return r->pages.Take(first, n);
}

void* Heap::AllocExtent(unsigned access_class, void* new_addr, size_t size, size_t alignment,
                        bool* zero) {
  if (size == 0 || (size & (kPageSize - 1)) != 0) return nullptr;
  size_t n = size >> kPageShift;
  size_t align = alignment > kPageSize ? alignment >> kPageShift : 1;
  Region* r = nullptr;
  size_t first = 0;
  bool dirty = false;
  {
    SpinLockGuard g(heap_lock_);
    if (new_addr != nullptr) {
      // In-place growth: only if those exact pages are free in one region.
      uintptr_t a = reinterpret_cast<uintptr_t>(new_addr);
      r = RegionOf(new_addr, size);
      if (r == nullptr || r->access_class != access_class || a % (align << kPageShift) != 0)
        return nullptr;
      first = (a - r->begin()) >> kPageShift;
      if (!r->pages.IsFree(first, n)) return nullptr;
      dirty = CarveLocked(r, first, n);
    } else {
      // Fullest region that fits: busy regions pack tighter and nearly
      // empty ones drain, so they can be released (a region is only released
      // whole); ties go to the lower address.
      size_t best_free = SIZE_MAX;
      for (Region* c = regions_; c != nullptr; c = c->next) {
        size_t free_pages = c->pages.npages() - c->pages.used_pages();
        if (c->dedicated || c->access_class != access_class || free_pages < n ||
            free_pages >= best_free)
          continue;
        size_t skew = (c->begin() >> kPageShift) & (align - 1);
        size_t at = c->pages.FindFree(n, align, skew);
        if (at < c->pages.npages()) {
          r = c;
          first = at;
          best_free = free_pages;
        }
      }
      if (r != nullptr) dirty = CarveLocked(r, first, n);
    }
  }
  if (r == nullptr && new_addr == nullptr) {
    r = NewRegion(size, alignment, access_class);
    if (r == nullptr) return nullptr;
    first = 0;
    dirty = false;  // NewRegion carved the first pages of fresh memory
  }
  if (r == nullptr) return nullptr;
  void* p = reinterpret_cast<void*>(r->begin() + (first << kPageShift));
  // Freed pages of a registered region are never purged, so they may hold
  // old bytes; jemalloc asked for zeroes or is told the truth.
  if (*zero && dirty) memset(p, 0, size);
  else if (!*zero) *zero = !dirty;
  return p;
}

Region* Heap::NewRegion(size_t size, size_t alignment, unsigned access_class) {
  size_t grow;
  {
    SpinLockGuard g(heap_lock_);
    size_t next = next_region_bytes_[access_class];
    grow = next < config_.region_size ? next : config_.region_size;
  }
  size_t bytes = RoundUp(size, kChunkSize);
  if (bytes < grow) bytes = grow;
  size_t align = alignment > kChunkSize ? alignment : kChunkSize;
  void* mem = MapAligned(bytes, align);
  if (mem == nullptr) return nullptr;
  size_t npages = bytes >> kPageShift;
  size_t words_bytes = RoundUp(2 * PageMap::WordsFor(npages) * sizeof(uint64_t), kPageSize);
  void* words = mmap(nullptr, words_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                     -1, 0);
  Region* r = nullptr;
  if (words != MAP_FAILED) {
    SpinLockGuard g(heap_lock_);
    if (free_descriptors_ != nullptr) {
      r = free_descriptors_;
      free_descriptors_ = r->next;
    } else if (descriptors_used_ < kMaxRegions) {
      r = &pool_[descriptors_used_];
      descriptors_used_++;
    }
  }
  if (r == nullptr) {
    if (words != MAP_FAILED) munmap(words, words_bytes);
    munmap(mem, bytes);
    return nullptr;
  }
  r->base.store(reinterpret_cast<uintptr_t>(mem), std::memory_order_relaxed);
  r->size.store(bytes, std::memory_order_relaxed);
  r->page_words = static_cast<uint64_t*>(words);
  r->page_words_bytes = words_bytes;
  r->pages.Init(r->page_words, npages);
  r->next = nullptr;
  r->dedicated = size > config_.region_size;
  r->access_class = static_cast<uint8_t>(access_class);
  // Live from here on: a concurrent RemoveDomain scan sees it (seq_cst).
  r->seq.fetch_add(1);
  heap_lock_.Lock();
  if (!map_.Set(r->begin(), bytes, r)) {
    // No memory for a map leaf: memory nobody can find must not be handed out.
    heap_lock_.Unlock();
    r->seq.fetch_add(1);
    munmap(mem, bytes);
    Recycle(r);
    return nullptr;
  }
  Region** link = &regions_;
  while (*link != nullptr && (*link)->begin() < r->begin()) link = &(*link)->next;
  r->next = *link;
  *link = r;
  // Mapped before in use, so a concurrent stats reader never sees more bytes
  // in use than mapped (Unmap subtracts after the last page came back).
  bytes_mapped_.fetch_add(bytes, std::memory_order_release);
  CarveLocked(r, 0, size >> kPageShift);  // fresh pages: clean
  if (next_region_bytes_[access_class] < config_.region_size) next_region_bytes_[access_class] *= 2;
  heap_lock_.Unlock();
  // Eager registration, in hook context: TryLock only (hook context never
  // waits on reg_lock). It fails only while a scan of every region (a pd
  // added or removed, a dump) holds it; the first lookup registers then.
  if (config_.register_mode == RegisterMode::kEager &&
      backend_ready_.load(std::memory_order_acquire) && r->reg_lock.TryLock()) {
    for (int d = 0; d < kMaxDomains; d++) {
      if (domains_[d].state.load() == DomainSlot::kOpen &&
          r->reg[d].state.load() != RegSlot::kRegistered)
        RegisterLocked(r, d);
    }
    Unlock(r);
  }
  regions_created_.fetch_add(1, std::memory_order_relaxed);
  Log(2, "new region %p+%zu%s, access class %u", mem, bytes, r->dedicated ? " (dedicated)" : "",
      access_class);
  return r;
}

void Heap::FreeExtent(Region* r, void* addr, size_t size) {
  size_t first = (reinterpret_cast<uintptr_t>(addr) - r->begin()) >> kPageShift;
  size_t n = size >> kPageShift;
  // An unregistered region gives freed pages back to the OS as jemalloc
  // would. Under reg_lock no registration can pin them meanwhile; if the lock
  // is busy (a registration is under way) the pages simply stay. With
  // observers nothing is purged: another cache may have registered the pages
  // itself, and it only hears of whole regions (see AddObserver).
  hook_busy_.fetch_add(1);
  bool purged = false;
  if (observer_count_.load() == 0 && r->registrations.load() == 0 && r->reg_lock.TryLock()) {
    if (r->registrations.load() == 0) purged = madvise(addr, size, MADV_DONTNEED) == 0;
    Unlock(r);
  }
  bool empty;
  {
    SpinLockGuard g(heap_lock_);
    r->pages.Give(first, n, purged);
    pages_in_use_.fetch_sub(n, std::memory_order_relaxed);
    empty = r->pages.used_pages() == 0;
    if (empty) {
      Region** link = &regions_;
      while (*link != r) link = &(*link)->next;
      *link = r->next;
      map_.Clear(r->begin(), r->length());
      r->seq.fetch_add(1);  // even: lookups that raced with us now fail
    }
  }
  if (empty) {
    r->release_wanted.store(true);
    RunRelease(r);
  }
  hook_busy_.fetch_sub(1);
}

void Heap::Recycle(Region* r) {
  munmap(r->page_words, r->page_words_bytes);
  r->page_words = nullptr;
  r->base.store(0, std::memory_order_relaxed);
  r->size.store(0, std::memory_order_relaxed);
  SpinLockGuard g(heap_lock_);
  r->next = free_descriptors_;
  free_descriptors_ = r;
}

// ------------------------------------------------------------- registration

int Heap::RegisterLocked(Region* r, int d) {
  Domain* dom = domains_[d].domain.load(std::memory_order_acquire);
  if (dom == nullptr || domains_[d].state.load() != DomainSlot::kOpen) return ENODEV;
  RegSlot& s = r->reg[d];
  DomainCounters& dc = domain_counters_[d];
  // The cap is claimed before registering, so racing registrations cannot
  // overshoot it together.
  uint64_t claimed = bytes_registered_.fetch_add(r->length()) + r->length();
  if (claimed > config_.max_pinned) {
    bytes_registered_.fetch_sub(r->length());
    cap_hits_.fetch_add(1, std::memory_order_relaxed);
    s.state.store(RegSlot::kFailed, std::memory_order_relaxed);
    return ENOMEM;
  }
  Registration reg;
  reg.access = RegionAccess(r, d);
  uint64_t t0 = NowNs();
  int err = dom->Register(reinterpret_cast<void*>(r->begin()), r->length(), &reg);
  reg_ns_.fetch_add(NowNs() - t0, std::memory_order_relaxed);
  reg_calls_.fetch_add(1, std::memory_order_relaxed);
  dc.reg_calls.fetch_add(1, std::memory_order_relaxed);
  if (err != 0) {
    bytes_registered_.fetch_sub(r->length());
    s.state.store(RegSlot::kFailed, std::memory_order_relaxed);
    reg_failures_.fetch_add(1, std::memory_order_relaxed);
    dc.reg_failures.fetch_add(1, std::memory_order_relaxed);
    Log(2, "register region %p+%zu with domain %d failed: errno %d", (void*)r->begin(),
        r->length(), d, err);
    return err;
  }
  s.seq.fetch_add(1);  // odd: readers retry
  s.lkey.store(reg.lkey, std::memory_order_relaxed);
  s.rkey.store(reg.rkey, std::memory_order_relaxed);
  s.key_shift.store(reg.key_shift, std::memory_order_relaxed);
  s.slots.store(reg.slots, std::memory_order_relaxed);
  s.mr.store(reg.handle, std::memory_order_relaxed);
  s.access.store(reg.access, std::memory_order_relaxed);
  s.handle.store(reg.handle != nullptr ? reg.handle : dom->handle(), std::memory_order_relaxed);
  s.state.store(RegSlot::kRegistered, std::memory_order_relaxed);
  s.seq.fetch_add(1, std::memory_order_release);
  if (r->registrations.fetch_add(1) == 0) bytes_pinned_.fetch_add(r->length(), std::memory_order_relaxed);
  dc.bytes_registered.fetch_add(r->length(), std::memory_order_relaxed);
  Log(2, "registered region %p+%zu with domain %d: lkey %u", (void*)r->begin(), r->length(), d,
      reg.lkey);
  return 0;
}

void Heap::DeregisterLocked(Region* r, int d) {
  RegSlot& s = r->reg[d];
  if (s.state.load(std::memory_order_relaxed) != RegSlot::kRegistered) {
    s.state.store(RegSlot::kNone, std::memory_order_relaxed);
    return;
  }
  Registration reg;
  reg.lkey = s.lkey.load(std::memory_order_relaxed);
  reg.rkey = s.rkey.load(std::memory_order_relaxed);
  reg.key_shift = s.key_shift.load(std::memory_order_relaxed);
  reg.slots = s.slots.load(std::memory_order_relaxed);
  reg.handle = s.mr.load(std::memory_order_relaxed);
  s.seq.fetch_add(1);
  s.state.store(RegSlot::kNone, std::memory_order_relaxed);
  Domain* dom = domains_[d].domain.load(std::memory_order_acquire);
  uint64_t t0 = NowNs();
  if (dom != nullptr) dom->Deregister(reinterpret_cast<void*>(r->begin()), r->length(), reg);
  dereg_ns_.fetch_add(NowNs() - t0, std::memory_order_relaxed);
  dereg_calls_.fetch_add(1, std::memory_order_relaxed);
  domain_counters_[d].dereg_calls.fetch_add(1, std::memory_order_relaxed);
  domain_counters_[d].bytes_registered.fetch_sub(r->length(), std::memory_order_relaxed);
  s.seq.fetch_add(1, std::memory_order_release);
  if (r->registrations.fetch_sub(1) == 1) bytes_pinned_.fetch_sub(r->length(), std::memory_order_relaxed);
  bytes_registered_.fetch_sub(r->length(), std::memory_order_relaxed);
  Log(2, "deregistered region %p+%zu from domain %d", (void*)r->begin(), r->length(), d);
}

int Heap::RegionAccess(const Region* r, int d) const {
  int domain_access = domains_[d].access.load(std::memory_order_relaxed);
  if (r->access_class == 0) return domain_access;
  return ClassRights(r->access_class) | (domain_access & kAccessRelaxedOrdering);
}

// Deregisters every domain and returns true: the caller then drops reg_lock
// and calls Unmap. Returns false if the release is queued for the release
// thread instead: observers must hear of it (callbacks run there only), or a
// backend that mallocs must deregister (never in hook context; and a lookup
// that happened to hold the lock does no release work either).
bool Heap::ReleaseLocked(Region* r) {
  if (observer_count_.load() > 0 ||
      (r->registrations.load() > 0 && !registrar_->hook_safe())) {
    {
      SpinLockGuard g(pending_lock_);
      r->next = pending_;
      pending_ = r;
      pending_count_.fetch_add(1, std::memory_order_release);
    }
    releases_deferred_.fetch_add(1, std::memory_order_relaxed);
    AddReleaseWork();
    return false;
  }
  for (int d = 0; d < kMaxDomains; d++) DeregisterLocked(r, d);
  return true;
}

// The region is out of the map and unregistered; nobody else can reach it.
void Heap::Unmap(Region* r) {
  munmap(reinterpret_cast<void*>(r->begin()), r->length());
  bytes_mapped_.fetch_sub(r->length(), std::memory_order_relaxed);
  regions_released_.fetch_add(1, std::memory_order_relaxed);
  Log(2, "released region %p+%zu", (void*)r->begin(), r->length());
  Recycle(r);
}

// Whoever holds reg_lock when a release is wanted performs it: hook context
// never waits for a registration that may itself be inside malloc.
void Heap::RunRelease(Region* r) {
  while (r->release_wanted.load() && r->reg_lock.TryLock()) {
    if (!r->release_wanted.exchange(false)) {
      r->reg_lock.Unlock();
      continue;
    }
    bool done = ReleaseLocked(r);
    r->reg_lock.Unlock();
    if (done) Unmap(r);
    return;
  }
}

void Heap::Unlock(Region* r) {
  r->reg_lock.Unlock();
  RunRelease(r);
}

// The release thread only. Deregister first, then notify, then unmap: the
// observers drop their entries while the addresses are still ours, so no new
// mapping can appear there before they did.
void Heap::ReleaseQueued() {
  Region* list;
  {
    SpinLockGuard g(pending_lock_);
    list = pending_;
    pending_ = nullptr;
    // Counted as releasing before it stops counting as queued: a reader
    // waiting for releases_pending == 0 never sees a gap.
    releasing_.fetch_add(pending_count_.load());
    pending_count_.store(0);
  }
  while (list != nullptr) {
    Region* r = list;
    list = r->next;
    r->reg_lock.Lock();
    for (int d = 0; d < kMaxDomains; d++) DeregisterLocked(r, d);
    r->reg_lock.Unlock();
    Notify(r->begin(), r->length());
    Unmap(r);
    releasing_.fetch_sub(1);
  }
}

// Outside every lock, on the release thread: a callback may call any
// rdmalloc_* function, malloc and free, or remove itself. The observers are
// copied first, so that the table may change while they run.
void Heap::Notify(uintptr_t base, size_t len) {
  Observer now[kMaxObservers];
  int n = 0;
  {
    SpinLockGuard g(api_lock_);
    for (const Observer& o : observers_) {
      if (o.fn != nullptr) now[n++] = o;
    }
  }
  for (int i = 0; i < n; i++) {
    now[i].fn(reinterpret_cast<void*>(base), len, now[i].arg);
    releases_notified_.fetch_add(1, std::memory_order_relaxed);
  }
}

// Removed observers' last calls, fn(NULL, 0, arg), in the order of removal.
// The release thread makes every delivery, so each comes after any delivery
// to that observer that was under way when it was removed.
void Heap::SayGoodbyes() {
  if (goodbyes_owed_.load() == 0) return;
  Goodbye* list;
  {
    SpinLockGuard g(api_lock_);
    list = goodbyes_;
    goodbyes_ = nullptr;
  }
  Goodbye* fifo = nullptr;
  while (list != nullptr) {
    Goodbye* next = list->next;
    list->next = fifo;
    fifo = list;
    list = next;
  }
  while (fifo != nullptr) {
    Goodbye* g = fifo;
    fifo = g->next;
    g->fn(nullptr, 0, g->arg);
    goodbyes_owed_.fetch_sub(1);
    free(g);
  }
}

int Heap::AddObserver(rdmalloc_release_fn fn, void* arg) {
  if (fn == nullptr) return RDMALLOC_EINVAL;
  {
    SpinLockGuard g(api_lock_);
    Observer* slot = nullptr;
    for (Observer& o : observers_) {
      if (o.fn == fn && o.arg == arg) return RDMALLOC_EINVAL;  // already there
      if (o.fn == nullptr && slot == nullptr) slot = &o;
    }
    // Until its last call, a removed pair cannot come back: that call would
    // reach the new registration.
    for (Goodbye* b = goodbyes_; b != nullptr; b = b->next) {
      if (b->fn == fn && b->arg == arg) {
        errno = EBUSY;
        return RDMALLOC_EINVAL;
      }
    }
    if (slot == nullptr) {
      errno = ENOSPC;
      return RDMALLOC_EINVAL;
    }
    slot->fn = fn;
    slot->arg = arg;
    observer_count_.fetch_add(1);
  }
  // A FreeExtent that read "no observers" may still purge or release without
  // telling; wait for those (hooks never wait for callbacks), so every
  // release that ends after we return is notified and nothing is purged.
  while (hook_busy_.load() != 0) sched_yield();
  EnsureReleaseThread();
  return RDMALLOC_OK;
}

int Heap::RemoveObserver(rdmalloc_release_fn fn, void* arg) {
  if (fn == nullptr) return RDMALLOC_EINVAL;
  auto* goodbye = static_cast<Goodbye*>(malloc(sizeof(Goodbye)));
  if (goodbye == nullptr) {
    errno = ENOMEM;
    return RDMALLOC_EINVAL;
  }
  {
    SpinLockGuard g(api_lock_);
    Observer* found = nullptr;
    for (Observer& o : observers_) {
      if (o.fn == fn && o.arg == arg) found = &o;
    }
    if (found != nullptr) {
      *found = Observer{};
      observer_count_.fetch_sub(1);
      *goodbye = Goodbye{fn, arg, goodbyes_};
      goodbyes_ = goodbye;
      goodbyes_owed_.fetch_add(1);
      goodbye = nullptr;
    }
  }
  if (goodbye != nullptr) {  // not registered
    free(goodbye);
    return RDMALLOC_EINVAL;
  }
  AddReleaseWork();
  EnsureReleaseThread();
  return RDMALLOC_OK;
}

// Releases queued in hook context (verbs deregistrations, observers) are done
// by a thread of ours. Started from API context only: pthread_create allocates.
void Heap::EnsureReleaseThread() {
  if (release_thread_.load(std::memory_order_acquire)) return;
  bool needed = observer_count_.load() > 0 || goodbyes_owed_.load() > 0 ||
                pending_count_.load() > 0 ||
                (backend_ready_.load(std::memory_order_acquire) && registrar_ != nullptr &&
                 !registrar_->hook_safe());
  if (!needed || release_thread_.exchange(true)) return;
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
  // Signals are the application's business: none is delivered to this thread.
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old);
  pthread_t thread;
  int err = pthread_create(&thread, &attr, ReleaseThreadMain, this);
  pthread_sigmask(SIG_SETMASK, &old, nullptr);
  pthread_attr_destroy(&attr);
  if (err != 0) {
    release_thread_.store(false);
    Log(0, "cannot start the release thread (errno %d): released regions stay mapped and "
           "registered until it can be started",
        err);
    return;
  }
  pthread_setname_np(thread, "rdmalloc-rel");
}

void Heap::AddReleaseWork() {
  release_work_.fetch_add(1, std::memory_order_release);
  if (release_thread_.load(std::memory_order_relaxed))
    syscall(SYS_futex, &release_work_, FUTEX_WAKE_PRIVATE, 1, nullptr, nullptr, 0);
}

void* Heap::ReleaseThreadMain(void* arg) {
  Heap* heap = static_cast<Heap*>(arg);
  static_assert(sizeof(std::atomic<int>) == sizeof(int), "futex word");
  for (;;) {
    if (heap->release_work_.exchange(0, std::memory_order_acquire) == 0)
      syscall(SYS_futex, &heap->release_work_, FUTEX_WAIT_PRIVATE, 0, nullptr, nullptr, 0);
    heap->ReleaseQueued();
    heap->SayGoodbyes();
  }
  return nullptr;
}

void Heap::RegisterAllLive(int d) {
  size_t used;
  {
    SpinLockGuard g(heap_lock_);
    used = descriptors_used_;
  }
  for (size_t i = 0; i < used; i++) {
    Region* r = &pool_[i];
    if (!(r->seq.load() & 1)) continue;
    r->reg_lock.Lock();
    if ((r->seq.load() & 1) && r->reg[d].state.load() != RegSlot::kRegistered) RegisterLocked(r, d);
    Unlock(r);
  }
}

// ------------------------------------------------------------------ lookups

int Heap::LookupSlow(uintptr_t a, size_t len, int d, rdmalloc_keys* out) {
  lookup_slow_.fetch_add(1, std::memory_order_relaxed);
  EnsureBackend();
  EnsureReleaseThread();  // a registration on verbs will need it for its release
  Region* r = map_.Find(a);
  if (r == nullptr) return Fail(RDMALLOC_ENOTOURS, MyStripe().not_ours);
  r->reg_lock.Lock();
  if (!(r->seq.load() & 1) || !r->Contains(a, 1)) {
    Unlock(r);
    return Fail(RDMALLOC_ENOTOURS, MyStripe().not_ours);
  }
  if (!r->Contains(a, len)) {
    Unlock(r);
    return Fail(RDMALLOC_ECROSS, MyStripe().cross);
  }
  if (d != 0 && domains_[d].state.load() != DomainSlot::kOpen) {
    Unlock(r);
    return Fail(RDMALLOC_EINVAL, MyStripe().einval);
  }
  RegSlot& s = r->reg[d];
  int err = s.state.load() == RegSlot::kRegistered ? 0 : RegisterLocked(r, d);
  if (err == ENODEV && d != 0) {  // the pd is being removed right now: unknown pd
    Unlock(r);
    return Fail(RDMALLOC_EINVAL, MyStripe().einval);
  }
  if (err != 0) {
    Unlock(r);
    memset(out, 0, sizeof *out);
    out->reg_errno = err;
    out->domain = d;
    errno = err;
    return Fail(RDMALLOC_EREGFAIL, lookup_reg_failed_);
  }
  FillKeys(r, d, a, len, s.lkey.load(), s.rkey.load(), s.key_shift.load(), s.handle.load(),
           s.access.load(), out);
  Unlock(r);
  return RDMALLOC_OK;
}

// ------------------------------------------------------------------ domains

int Heap::AddDomain(ibv_pd* pd, int access) {
  if (pd == nullptr || (access & ~kKnownAccess) != 0) return RDMALLOC_EINVAL;
  EnsureBackend();
  EnsureReleaseThread();
  if (registrar_ == nullptr) {
    errno = ENODEV;
    return RDMALLOC_ENOTSUP;
  }
  SpinLockGuard g(api_lock_);
  int slot = -1;
  for (int i = 1; i < kMaxDomains; i++) {
    if (domains_[i].state.load() != DomainSlot::kFree && domains_[i].pd.load() == pd)
      return RDMALLOC_EINVAL;
    if (slot < 0 && domains_[i].state.load() == DomainSlot::kFree) slot = i;
  }
  if (slot < 0) {
    errno = ENOSPC;
    return RDMALLOC_EINVAL;
  }
  int err = 0;
  Domain* dom = registrar_->OpenDomain(pd, access, &err);
  if (dom == nullptr) {
    errno = err;
    return RDMALLOC_EREGFAIL;
  }
  domains_[slot].access.store(access, std::memory_order_relaxed);
  domains_[slot].domain.store(dom, std::memory_order_release);
  domains_[slot].pd.store(pd, std::memory_order_release);
  domains_[slot].state.store(DomainSlot::kOpen);
  if (config_.register_mode == RegisterMode::kEager) RegisterAllLive(slot);
  return RDMALLOC_OK;
}

int Heap::RemoveDomain(ibv_pd* pd) {
  if (pd == nullptr) return RDMALLOC_EINVAL;
  SpinLockGuard g(api_lock_);
  int d = DomainIndex(pd);
  if (d < 0) return RDMALLOC_EINVAL;
  // Closing first: registrations that start after this see it (seq_cst) and
  // give up; those before it are found by the scan below.
  domains_[d].state.store(DomainSlot::kClosing);
  size_t used;
  {
    SpinLockGuard hg(heap_lock_);
    used = descriptors_used_;
  }
  for (size_t i = 0; i < used; i++) {
    Region* r = &pool_[i];
    r->reg_lock.Lock();
    DeregisterLocked(r, d);
    Unlock(r);
  }
  Domain* dom = domains_[d].domain.exchange(nullptr);
  domains_[d].pd.store(nullptr);
  domains_[d].state.store(DomainSlot::kFree);
  domain_counters_[d].Reset();
  delete dom;
  return RDMALLOC_OK;
}

// ---------------------------------------------------------------------- dma

int Heap::Dma(const rdmalloc_keys* k, size_t off, void* buf, size_t n, bool to_memory) {
  if (k == nullptr || (buf == nullptr && n != 0) || off > k->len || n > k->len - off ||
      k->domain < 0 || k->domain >= kMaxDomains)
    return RDMALLOC_EINVAL;
  if (n == 0) return RDMALLOC_OK;
  uintptr_t a = reinterpret_cast<uintptr_t>(k->addr) + off;
  Region* r = map_.Find(a);
  if (r == nullptr) return RDMALLOC_ENOTOURS;
  int d = k->domain;
  r->reg_lock.Lock();
  RegSlot& s = r->reg[d];
  Domain* dom = domains_[d].domain.load(std::memory_order_acquire);
  if (!(r->seq.load() & 1) || !r->Contains(a, n) ||
      r->begin() != reinterpret_cast<uintptr_t>(k->region_base) ||
      s.state.load() != RegSlot::kRegistered || dom == nullptr) {
    Unlock(r);
    return RDMALLOC_ENOTOURS;
  }
  Registration reg;
  reg.lkey = s.lkey.load();
  reg.rkey = s.rkey.load();
  reg.key_shift = s.key_shift.load();
  reg.slots = s.slots.load();
  reg.handle = s.mr.load();
  reg.access = s.access.load();
  void* region_base = reinterpret_cast<void*>(r->begin());
  int err = to_memory ? dom->DmaWrite(reg, region_base, reinterpret_cast<void*>(a), buf, n)
                      : dom->DmaRead(reg, region_base, reinterpret_cast<void*>(a), buf, n);
  Unlock(r);
  if (err == 0) return RDMALLOC_OK;
  errno = err;
  return err == ENOTSUP || err == EOPNOTSUPP ? RDMALLOC_ENOTSUP : RDMALLOC_EDMA;
}

// -------------------------------------------------------------------- stats

int Heap::Stats(struct rdmalloc_stats* out, size_t size) {
  if (out == nullptr || size < 2 * sizeof(uint32_t)) return RDMALLOC_EINVAL;
  EnsureReleaseThread();
  struct rdmalloc_stats s;
  memset(&s, 0, sizeof s);
  s.version = RDMALLOC_STATS_VERSION;
  s.size = static_cast<uint32_t>(size < sizeof s ? size : sizeof s);
  auto get = [](const std::atomic<uint64_t>& v) { return v.load(std::memory_order_relaxed); };
  s.regions_created = get(regions_created_);
  s.regions_released = get(regions_released_);
  s.regions_live = s.regions_created - s.regions_released;
  s.bytes_in_use = pages_in_use_.load(std::memory_order_acquire) << kPageShift;
  s.bytes_mapped = bytes_mapped_.load(std::memory_order_acquire);
  s.bytes_registered = get(bytes_registered_);
  s.bytes_pinned = get(bytes_pinned_);
  for (const DomainSlot& d : domains_) s.domains += d.state.load() == DomainSlot::kOpen;
  s.reg_calls = get(reg_calls_);
  s.dereg_calls = get(dereg_calls_);
  s.reg_ns = get(reg_ns_);
  s.dereg_ns = get(dereg_ns_);
  s.reg_failures = get(reg_failures_);
  for (const Stripe& st : stripes_) {
    s.lookups += get(st.lookups);
    s.lookup_not_ours += get(st.not_ours);
    s.lookup_cross += get(st.cross);
    s.lookup_einval += get(st.einval);
  }
  s.lookup_reg_failed = get(lookup_reg_failed_);
  s.lookup_slow = get(lookup_slow_);
  s.foreign_extents = get(foreign_extents_);
  s.releases_deferred = get(releases_deferred_);
  s.cap_hits = get(cap_hits_);
  s.max_pinned = config_.max_pinned;
  s.releases_notified = get(releases_notified_);
  s.observers = static_cast<uint64_t>(observer_count_.load());
  s.releases_pending = static_cast<uint64_t>(pending_count_.load() + releasing_.load());
  for (int d = 0; d < kMaxDomains; d++) {
    rdmalloc_domain_stats& o = s.domain[d];
    const DomainCounters& dc = domain_counters_[d];
    o.open = domains_[d].state.load() == DomainSlot::kOpen;
    o.pd = domains_[d].pd.load();
    o.bytes_registered = get(dc.bytes_registered);
    o.reg_calls = get(dc.reg_calls);
    o.dereg_calls = get(dc.dereg_calls);
    o.reg_failures = get(dc.reg_failures);
  }
  memcpy(out, &s, s.size);
  return RDMALLOC_OK;
}

int Heap::VisitRegions(void (*visit)(const RegionInfo& info, void* ctx), void* ctx) {
  size_t used;
  {
    SpinLockGuard g(heap_lock_);
    used = descriptors_used_;
  }
  int count = 0;
  for (size_t i = 0; i < used; i++) {
    Region* r = &pool_[i];
    // Copy under the locks, visit after: the visitor may allocate.
    RegionInfo info;
    bool live;
    r->reg_lock.Lock();
    {
      SpinLockGuard g(heap_lock_);
      live = r->seq.load() & 1;
      // A descriptor that is not live may be set up by NewRegion outside the
      // heap lock right now; a live one's page map only changes under it.
      if (live) {
        info.base = r->begin();
        info.size = r->length();
        info.pages = r->pages.npages();
        info.pages_in_use = r->pages.used_pages();
        info.dedicated = r->dedicated;
        info.access_class = r->access_class;
      }
    }
    for (int d = 0; d < kMaxDomains; d++) {
      info.reg[d] = {r->reg[d].state.load(), r->reg[d].lkey.load(), r->reg[d].rkey.load()};
    }
    Unlock(r);
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
        if (r.access_class != 0)
          fprintf(out, "  class %s", ClassRightsName(r.access_class));
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

// --------------------------------------------------------------------- fork

// The heap's three stages of the fork protocol. reg_lock is not taken: it
// guards registrations, which the child forgets, and hook context never waits
// for it; the child resets every one.
void Heap::InstallForkHandlers() {
  ForkHandlers api;
  api.prepare = [] { g_heap.api_lock_.Lock(); };
  api.parent = [] { g_heap.api_lock_.Unlock(); };
  api.child = [] { g_heap.ForkChildApi(); };
  SetForkHandlers(LockRank::kApi, api);
  ForkHandlers heap;
  heap.prepare = [] { g_heap.heap_lock_.Lock(); };
  heap.parent = [] { g_heap.heap_lock_.Unlock(); };
  heap.child = [] { g_heap.ForkChildHeap(); };
  SetForkHandlers(LockRank::kHeap, heap);
  ForkHandlers queue;
  queue.prepare = [] { g_heap.pending_lock_.Lock(); };
  queue.parent = [] { g_heap.pending_lock_.Unlock(); };
  queue.child = [] { g_heap.ForkChildReleaseQueue(); };
  SetForkHandlers(LockRank::kReleaseQueue, queue);
}

// Threads do not survive fork: the release thread starts again when the child
// next calls malloc or rdmalloc_* (EnsureReleaseThread), and takes over what
// was queued. A release another thread had under way is not finished here
// (that region stays mapped in the child), and nobody may wait for work of
// threads that are gone.
void Heap::ForkChildReleaseQueue() {
  pending_lock_.ResetAfterFork();
  release_thread_.store(false, std::memory_order_relaxed);
  releasing_.store(0, std::memory_order_relaxed);
  release_work_.store(pending_count_.load() + goodbyes_owed_.load(), std::memory_order_relaxed);
  hook_busy_.store(0, std::memory_order_relaxed);
}

void Heap::ForkChildHeap() { heap_lock_.ResetAfterFork(); }

// Registrations are the parent's kernel objects: forget them, do not undo them.
void Heap::ForkChildApi() {
  api_lock_.ResetAfterFork();
  for (size_t i = 0; i < descriptors_used_; i++) {
    Region* r = &pool_[i];
    r->reg_lock.ResetAfterFork();
    for (RegSlot& s : r->reg) {
      s.state.store(RegSlot::kNone, std::memory_order_relaxed);
      s.seq.store(0, std::memory_order_relaxed);
    }
    r->registrations.store(0, std::memory_order_relaxed);
  }
  bytes_registered_.store(0, std::memory_order_relaxed);
  bytes_pinned_.store(0, std::memory_order_relaxed);
  for (DomainCounters& dc : domain_counters_) dc.bytes_registered.store(0, std::memory_order_relaxed);
  for (DomainSlot& d : domains_) {
    if (Domain* dom = d.domain.load(std::memory_order_relaxed)) dom->ForgetAfterFork();
  }
}

}  // namespace rdmalloc
