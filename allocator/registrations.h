// Registrations: the backend (verbs/ behind its Registrar seam), the table of
// domains (protection domains, or pinning rings), and each region's
// registration with each domain: register, deregister, the pinning cap, the
// counters. Per-region operations run with the region's reg_lock held by the
// caller; which regions to (de)register, and when, is the facade's business
// (allocator/heap.h).
#ifndef RDMALLOC_ALLOCATOR_REGISTRATIONS_H_
#define RDMALLOC_ALLOCATOR_REGISTRATIONS_H_

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "allocator/config.h"
#include "allocator/rdmalloc.h"
#include "allocator/region.h"
#include "allocator/mutex.h"
#include "verbs/registrar.h"

namespace rdmalloc {

// The registration rights of an access class (plus local write, which remote
// write needs and every receive buffer does).
constexpr int ClassRights(unsigned access_class) {
  return kAccessLocalWrite | ((access_class & 1) ? kAccessRemoteRead : 0) |
         ((access_class & 2) ? kAccessRemoteWrite : 0) |
         ((access_class & 4) ? kAccessRemoteAtomic : 0);
}

class Registrations {
 public:
  constexpr Registrations() = default;
  Registrations(const Registrations&) = delete;
  Registrations& operator=(const Registrations&) = delete;

  // Start-up: the settings, then the backend's kind (no backend call yet).
  // Eager registration needs a hook-safe backend; without one it falls back
  // to lazy (and says so). `config` is the heap's, read for good: it is not
  // copied, so the state a program's start writes stays on one page.
  void Configure(const Config& config);
  void ChooseBackend();
  bool eager() const { return eager_; }
  bool verbs_chosen() const { return kind_ == Kind::kVerbs; }

  // Opens the backend and the default domain, once (API context: it may
  // allocate). Returns 0 or an errno. In eager mode the `opened` callback
  // (set at start-up) runs once the default domain is open, under lock(), to
  // register every live region; lazy mode registers nothing before a lookup.
  int EnsureBackend();
  void set_opened(void (*opened)(void* ctx), void* ctx) {
    opened_ = opened;
    opened_ctx_ = ctx;
  }
  bool backend_ready() const { return backend_ready_.load(std::memory_order_acquire) != 0; }
  bool has_backend() const { return backend_ready() && registrar_ != nullptr; }
  // Registrations and deregistrations never allocate: they may run in hook context.
  bool hook_safe() const { return registrar_ == nullptr || registrar_->hook_safe(); }
  const char* BackendName();
  const char* DeviceDescription();

  // The rights r's registration with domain d has (or would have); d < 0:
  // under a domain not added yet, with `plain_access` for the plain heap.
  int RegionAccess(const Region* r, int d, int plain_access = 0) const;
  // Domains. 0 is the default domain (pd NULL); -1: unknown pd.
  // Inline and without calls: the lookup's hit path runs it.
  int DomainIndex(ibv_pd* pd) const {
    if (pd == nullptr) return 0;
    for (int i = 1; i < kMaxDomains; i++) {
      if (domains_[i].pd.load(std::memory_order_acquire) == pd &&
          domains_[i].state.load(std::memory_order_acquire) == DomainSlot::kOpen)
        return i;
    }
    return -1;
  }
  bool open(int d) const { return domains_[d].state.load() == DomainSlot::kOpen; }
  // Adds pd with `access` for the plain heap: RDMALLOC_OK and its index in
  // *slot, or an RDMALLOC_E* code (errno set).
  int AddDomain(ibv_pd* pd, int access, int* slot);
  // Marks pd closing (registrations that start after this give up); the
  // caller then deregisters it from every region and calls FinishRemove.
  int BeginRemove(ibv_pd* pd, int* slot);
  void FinishRemove(int d);
  // Serialises backend start and the domain table (rank kApi).
  auto& lock() { return lock_; }

  // One region, one domain; r->reg_lock held.
  int Register(Region* r, int d);
  void Deregister(Region* r, int d);
  void DeregisterAll(Region* r) {
    for (int d = 0; d < kMaxDomains; d++) Deregister(r, d);
  }
  // Moves bytes through r's registration with d (a peer's RDMA WRITE or READ).
  int Dma(Region* r, int d, uintptr_t addr, void* buf, size_t n, bool to_memory);

  void FillStats(struct rdmalloc_stats* s) const;

  // A fork child: the registrations are the parent's kernel objects; forget
  // them (the caller resets each region's), do not undo them.
  void ForgetAfterFork();

 private:
  struct DomainSlot {
    enum : int { kFree = 0, kOpen = 1, kClosing = 2 };
    std::atomic<ibv_pd*> pd{nullptr};
    std::atomic<Domain*> domain{nullptr};
    std::atomic<int> state{kFree};
    std::atomic<int> access{0};  // rights of the plain heap under this domain
  };
  struct DomainCounters {
    std::atomic<uint64_t> bytes_registered{0}, reg_calls{0}, dereg_calls{0}, reg_failures{0};
    void Reset() {
      bytes_registered = 0;
      reg_calls = 0;
      dereg_calls = 0;
      reg_failures = 0;
    }
  };
  enum class Kind { kNone, kVerbs, kUring };
  const Config& config() const { return *config_; }

  const Config* config_ = nullptr;
  bool eager_ = false;
  void (*opened_)(void* ctx) = nullptr;
  void* opened_ctx_ = nullptr;
  Kind kind_ = Kind::kNone;
  bool uring_unprobed_ = false;  // chosen for want of a device; probed at EnsureBackend
  Registrar* registrar_ = nullptr;
  std::atomic<int> backend_ready_{0};
  int backend_err_ = 0;
  Mutex<LockRank::kApi> lock_;
  DomainSlot domains_[kMaxDomains];
  DomainCounters domain_counters_[kMaxDomains];
  std::atomic<uint64_t> bytes_registered_{0}, bytes_pinned_{0}, reg_calls_{0}, dereg_calls_{0},
      reg_ns_{0}, dereg_ns_{0}, reg_failures_{0}, cap_hits_{0};
};

}  // namespace rdmalloc

#endif  // RDMALLOC_ALLOCATOR_REGISTRATIONS_H_
