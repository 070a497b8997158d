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

class Heap {
 public:
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
  void* AllocExtent(void* new_addr, size_t size, size_t alignment, bool* zero);
  // The region wholly containing [addr, addr+size), or nullptr (foreign).
  Region* RegionOf(const void* addr, size_t size) const;
  // jemalloc gave [addr, addr+size) back for good (dalloc or destroy).
  void FreeExtent(Region* r, void* addr, size_t size);
  void CountForeign() { foreign_extents_.fetch_add(1, std::memory_order_relaxed); }

  // --- API side: ordinary context; may allocate and block.
  int Lookup(const void* addr, size_t len, ibv_pd* pd, rdmalloc_keys* out);
  int AddDomain(ibv_pd* pd, int access);
  int RemoveDomain(ibv_pd* pd);
  const char* BackendName();
  // For reports: the device in use, or what stands in for one.
  const char* DeviceDescription();
  int Dma(const rdmalloc_keys* k, size_t off, void* buf, size_t n, bool to_memory);
  int Stats(struct rdmalloc_stats* out, size_t size);
  int DumpRegions(FILE* out);
  // RDMALLOC_VERBOSE logging: one line on stderr, built on the stack and
  // written with write(2), so it is safe in hook context.
  void Log(int level, const char* format, ...) const __attribute__((format(printf, 3, 4)));

  // fork: keep our locks consistent in both processes; the child forgets
  // every registration (they belong to the parent's kernel objects).
  void PrepareFork();
  void ParentAfterFork();
  void ChildAfterFork();

 private:
  struct DomainSlot {
    enum : int { kFree = 0, kOpen = 1, kClosing = 2 };
    std::atomic<ibv_pd*> pd{nullptr};
    std::atomic<Domain*> domain{nullptr};
    std::atomic<int> state{kFree};
  };
  struct alignas(64) Stripe {
    std::atomic<uint64_t> lookups{0};
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

  int DomainIndex(ibv_pd* pd) const;
  int LookupSlow(uintptr_t a, size_t len, int d, rdmalloc_keys* out);
  void FillKeys(Region* r, int d, uintptr_t a, size_t len, uint32_t lkey, uint32_t rkey,
                uint32_t shift, void* handle, rdmalloc_keys* out) const;
  int EnsureBackend();
  int Fail(int code, std::atomic<uint64_t>* counter) {
    counter->fetch_add(1, std::memory_order_relaxed);
    return code;
  }

  // Page heap (heap_lock_ held).
  // Hands pages to jemalloc; returns whether any of them may be non-zero.
  bool CarveLocked(Region* r, size_t first, size_t n);
  Region* NewRegion(size_t bytes, size_t alignment);
  void Recycle(Region* r);

  // Registration (r->reg_lock held).
  int RegisterLocked(Region* r, int d);
  void DeregisterLocked(Region* r, int d);
  bool ReleaseLocked(Region* r, bool in_hook);
  void Unlock(Region* r, bool in_hook);
  void RunRelease(Region* r, bool in_hook);
  void DrainPending();
  void RegisterAllLive(int d);

  Config config_;
  Registrar* registrar_ = nullptr;
  std::atomic<int> backend_ready_{0};
  int backend_err_ = 0;
  SpinLock api_lock_;  // backend start, domain table changes

  DomainSlot domains_[kMaxDomains];
  DomainCounters domain_counters_[kMaxDomains];

  SpinLock heap_lock_;  // region list, page maps, descriptor pool
  RegionMap map_;
  Region* regions_ = nullptr;  // live regions by address
  Region* free_descriptors_ = nullptr;
  size_t descriptors_used_ = 0;
  size_t next_region_bytes_ = kChunkSize;
  Region pool_[kMaxRegions];

  SpinLock pending_lock_;
  Region* pending_ = nullptr;  // empty regions whose release must leave hook context
  std::atomic<int> pending_count_{0};

  Stripe stripes_[64];
  std::atomic<uint64_t> regions_created_{0}, regions_released_{0}, bytes_mapped_{0},
      pages_in_use_{0}, bytes_registered_{0}, bytes_pinned_{0}, reg_calls_{0}, dereg_calls_{0}, reg_ns_{0},
      dereg_ns_{0}, reg_failures_{0}, lookup_not_ours_{0}, lookup_cross_{0},
      lookup_reg_failed_{0}, lookup_einval_{0}, lookup_slow_{0}, foreign_extents_{0},
      releases_deferred_{0}, cap_hits_{0};
};

Heap& TheHeap();

}  // namespace rdmalloc

#endif  // RDMALLOC_ALLOCATOR_HEAP_H_
