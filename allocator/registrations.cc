#include "allocator/registrations.h"

#include <errno.h>

#include "allocator/log.h"
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

testing::RegistrarWrapper g_registrar_wrapper = nullptr;

}  // namespace

void testing::SetRegistrarWrapper(RegistrarWrapper wrap) { g_registrar_wrapper = wrap; }

void Registrations::Configure(const Config& config) {
  config_ = &config;
  eager_ = config.register_mode == RegisterMode::kEager;
}

void Registrations::ChooseBackend() {
  switch (config().backend) {
    case BackendChoice::kVerbs: kind_ = Kind::kVerbs; break;
    case BackendChoice::kUring: kind_ = Kind::kUring; break;
    case BackendChoice::kNone: kind_ = Kind::kNone; break;
    case BackendChoice::kAuto:
      // io_uring is probed when the backend opens (EnsureBackend), not at
      // every program's start: most never register anything.
      kind_ = CountRdmaDevices() > 0 ? Kind::kVerbs : Kind::kUring;
      uring_unprobed_ = kind_ == Kind::kUring;
      break;
  }
  // Eager registration happens inside the alloc hook, so only a backend that
  // never mallocs can do it; ibverbs always registers on first lookup.
  if (eager_ && kind_ != Kind::kUring) {
    eager_ = false;
    if (kind_ == Kind::kVerbs)
      Log(0, "RDMALLOC_REGISTER=eager needs the uring backend, and an RDMA device chose "
             "verbs; using lazy");
  }
}

int Registrations::EnsureBackend() {
  if (backend_ready_.load(std::memory_order_acquire)) return backend_err_;
  LockGuard g(lock_);
  if (backend_ready_.load(std::memory_order_relaxed)) return backend_err_;
  if (kind_ == Kind::kVerbs) {
    VerbsApi api;
    if (LoadVerbsApi(config().verbs_library, &api) == 0) {
      registrar_ = MakeVerbsRegistrar(api, config().device).release();
    } else {
      kind_ = UringProbe() == 0 ? Kind::kUring : Kind::kNone;
    }
  }
  if (uring_unprobed_ && UringProbe() != 0) {
    kind_ = Kind::kNone;
    eager_ = false;  // eager mode opens the backend at start-up, before any hook reads this
  }
  if (kind_ == Kind::kUring) registrar_ = MakeUringRegistrar().release();
  if (registrar_ != nullptr && g_registrar_wrapper != nullptr)
    registrar_ = g_registrar_wrapper(registrar_);
  int err = ENODEV;
  if (registrar_ != nullptr) {
    if (Domain* dom = registrar_->OpenDomain(nullptr, config().access, &err)) {
      domains_[0].access.store(config().access, std::memory_order_relaxed);
      domains_[0].domain.store(dom, std::memory_order_release);
      domains_[0].state.store(DomainSlot::kOpen);
      err = 0;
    }
  }
  backend_err_ = err;
  backend_ready_.store(1, std::memory_order_release);
  Log(1, "backend %s (%s)%s, %s registration, regions up to %zu MiB%s",
      registrar_ != nullptr ? registrar_->name() : "none", DeviceDescription(),
      err != 0 ? ", default domain failed to open" : "", eager_ ? "eager" : "lazy",
      config().region_size >> 20, config().max_pinned != kNoPinLimit ? ", pinning capped" : "");
  if (err == 0 && eager_ && opened_ != nullptr) opened_(opened_ctx_);
  return err;
}

const char* Registrations::BackendName() {
  EnsureBackend();
  return registrar_ != nullptr ? registrar_->name() : "none";
}

const char* Registrations::DeviceDescription() {
  if (!backend_ready_.load(std::memory_order_acquire)) EnsureBackend();
  if (registrar_ == nullptr) return "no backend: nothing is registered";
  if (kind_ == Kind::kUring)
    return config().backend == BackendChoice::kAuto
               ? "no RDMA device found: pinning through io_uring"
               : "pinning through io_uring";
  return registrar_->device_name();
}

int Registrations::AddDomain(ibv_pd* pd, int access, int* slot) {
  if (pd == nullptr || (access & ~kKnownAccess) != 0) return RDMALLOC_EINVAL;
  if (registrar_ == nullptr) {
    errno = ENODEV;
    return RDMALLOC_ENOTSUP;
  }
  int free = -1;
  for (int i = 1; i < kMaxDomains; i++) {
    if (domains_[i].state.load() != DomainSlot::kFree && domains_[i].pd.load() == pd)
      return RDMALLOC_EINVAL;
    if (free < 0 && domains_[i].state.load() == DomainSlot::kFree) free = i;
  }
  if (free < 0) {
    errno = ENOSPC;
    return RDMALLOC_EINVAL;
  }
  int err = 0;
  Domain* dom = registrar_->OpenDomain(pd, access, &err);
  if (dom == nullptr) {
    errno = err;
    return RDMALLOC_EREGFAIL;
  }
  domains_[free].access.store(access, std::memory_order_relaxed);
  domains_[free].domain.store(dom, std::memory_order_release);
  domains_[free].pd.store(pd, std::memory_order_release);
  domains_[free].state.store(DomainSlot::kOpen);
  *slot = free;
  return RDMALLOC_OK;
}

int Registrations::BeginRemove(ibv_pd* pd, int* slot) {
  if (pd == nullptr) return RDMALLOC_EINVAL;
  int d = DomainIndex(pd);
  if (d < 0) return RDMALLOC_EINVAL;
  // Closing first: registrations that start after this see it (seq_cst) and
  // give up; those before it are found by the caller's scan.
  domains_[d].state.store(DomainSlot::kClosing);
  *slot = d;
  return RDMALLOC_OK;
}

void Registrations::FinishRemove(int d) {
  Domain* dom = domains_[d].domain.exchange(nullptr);
  domains_[d].pd.store(nullptr);
  domains_[d].state.store(DomainSlot::kFree);
  domain_counters_[d].Reset();
  delete dom;
}

int Registrations::RegionAccess(const Region* r, int d, int plain_access) const {
  int domain_access = d >= 0 ? domains_[d].access.load(std::memory_order_relaxed) : plain_access;
  if (r->access_class == 0) return domain_access;
  return ClassRights(r->access_class) | (domain_access & kAccessRelaxedOrdering);
}

int Registrations::Register(Region* r, int d) {
  Domain* dom = domains_[d].domain.load(std::memory_order_acquire);
  if (dom == nullptr || domains_[d].state.load() != DomainSlot::kOpen) return ENODEV;
  RegSlot& s = r->reg[d];
  DomainCounters& dc = domain_counters_[d];
  // The cap is claimed before registering, so racing registrations cannot
  // overshoot it together.
  uint64_t claimed = bytes_registered_.fetch_add(r->length()) + r->length();
  if (claimed > config().max_pinned) {
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
  s.base.store(r->begin(), std::memory_order_relaxed);
  s.size.store(r->length(), std::memory_order_relaxed);
  s.lkey.store(reg.lkey, std::memory_order_relaxed);
  s.rkey.store(reg.rkey, std::memory_order_relaxed);
  s.step_shift.store(RegSlot::StepShift(reg.key_shift), std::memory_order_relaxed);
  s.slots.store(reg.slots, std::memory_order_relaxed);
  s.mr.store(reg.handle, std::memory_order_relaxed);
  s.access.store(reg.access, std::memory_order_relaxed);
  s.handle.store(reg.handle != nullptr ? reg.handle : dom->handle(), std::memory_order_relaxed);
  s.state.store(RegSlot::kRegistered, std::memory_order_relaxed);
  s.seq.fetch_add(1, std::memory_order_release);
  if (r->registrations.fetch_add(1) == 0)
    bytes_pinned_.fetch_add(r->length(), std::memory_order_relaxed);
  dc.bytes_registered.fetch_add(r->length(), std::memory_order_relaxed);
  Log(2, "registered region %p+%zu with domain %d: lkey %u", (void*)r->begin(), r->length(), d,
      reg.lkey);
  return 0;
}

void Registrations::Deregister(Region* r, int d) {
  RegSlot& s = r->reg[d];
  if (s.state.load(std::memory_order_relaxed) != RegSlot::kRegistered) {
    s.state.store(RegSlot::kNone, std::memory_order_relaxed);
    return;
  }
  Registration reg;
  reg.lkey = s.lkey.load(std::memory_order_relaxed);
  reg.rkey = s.rkey.load(std::memory_order_relaxed);
  reg.key_shift = s.key_shift();
  reg.slots = s.slots.load(std::memory_order_relaxed);
  reg.handle = s.mr.load(std::memory_order_relaxed);
  s.seq.fetch_add(1);
  s.state.store(RegSlot::kNone, std::memory_order_relaxed);
  s.size.store(0, std::memory_order_relaxed);
  Domain* dom = domains_[d].domain.load(std::memory_order_acquire);
  uint64_t t0 = NowNs();
  if (dom != nullptr) dom->Deregister(reinterpret_cast<void*>(r->begin()), r->length(), reg);
  dereg_ns_.fetch_add(NowNs() - t0, std::memory_order_relaxed);
  dereg_calls_.fetch_add(1, std::memory_order_relaxed);
  domain_counters_[d].dereg_calls.fetch_add(1, std::memory_order_relaxed);
  domain_counters_[d].bytes_registered.fetch_sub(r->length(), std::memory_order_relaxed);
  s.seq.fetch_add(1, std::memory_order_release);
  if (r->registrations.fetch_sub(1) == 1)
    bytes_pinned_.fetch_sub(r->length(), std::memory_order_relaxed);
  bytes_registered_.fetch_sub(r->length(), std::memory_order_relaxed);
  Log(2, "deregistered region %p+%zu from domain %d", (void*)r->begin(), r->length(), d);
}

int Registrations::Dma(Region* r, int d, uintptr_t addr, void* buf, size_t n, bool to_memory) {
  RegSlot& s = r->reg[d];
  Domain* dom = domains_[d].domain.load(std::memory_order_acquire);
  if (s.state.load() != RegSlot::kRegistered || dom == nullptr) return RDMALLOC_ENOTOURS;
  Registration reg;
  reg.lkey = s.lkey.load();
  reg.rkey = s.rkey.load();
  reg.key_shift = s.key_shift();
  reg.slots = s.slots.load();
  reg.handle = s.mr.load();
  reg.access = s.access.load();
  void* region_base = reinterpret_cast<void*>(r->begin());
  int err = to_memory ? dom->DmaWrite(reg, region_base, reinterpret_cast<void*>(addr), buf, n)
                      : dom->DmaRead(reg, region_base, reinterpret_cast<void*>(addr), buf, n);
  if (err == 0) return RDMALLOC_OK;
  errno = err;
  return err == ENOTSUP || err == EOPNOTSUPP ? RDMALLOC_ENOTSUP : RDMALLOC_EDMA;
}

void Registrations::FillStats(struct rdmalloc_stats* s) const {
  auto get = [](const std::atomic<uint64_t>& v) { return v.load(std::memory_order_relaxed); };
  s->bytes_registered = get(bytes_registered_);
  s->bytes_pinned = get(bytes_pinned_);
  for (const DomainSlot& d : domains_) s->domains += d.state.load() == DomainSlot::kOpen;
  s->reg_calls = get(reg_calls_);
  s->dereg_calls = get(dereg_calls_);
  s->reg_ns = get(reg_ns_);
  s->dereg_ns = get(dereg_ns_);
  s->reg_failures = get(reg_failures_);
  s->cap_hits = get(cap_hits_);
  s->max_pinned = config().max_pinned;
  for (int d = 0; d < kMaxDomains; d++) {
    rdmalloc_domain_stats& o = s->domain[d];
    const DomainCounters& dc = domain_counters_[d];
    o.open = domains_[d].state.load() == DomainSlot::kOpen;
    o.pd = domains_[d].pd.load();
    o.bytes_registered = get(dc.bytes_registered);
    o.reg_calls = get(dc.reg_calls);
    o.dereg_calls = get(dc.dereg_calls);
    o.reg_failures = get(dc.reg_failures);
  }
}

void Registrations::ForgetAfterFork() {
  lock_.ResetAfterFork();
  bytes_registered_.store(0, std::memory_order_relaxed);
  bytes_pinned_.store(0, std::memory_order_relaxed);
  for (DomainCounters& dc : domain_counters_) dc.bytes_registered.store(0, std::memory_order_relaxed);
  for (DomainSlot& d : domains_) {
    if (Domain* dom = d.domain.load(std::memory_order_relaxed)) dom->ForgetAfterFork();
  }
}

}  // namespace rdmalloc
