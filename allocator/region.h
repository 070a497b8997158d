// A region: one block of address space that rdmalloc mapped for jemalloc, the
// unit of registration. See docs/DESIGN.md ("Regions"; its states under "The
// extent life cycle").
#ifndef RDMALLOC_ALLOCATOR_REGION_H_
#define RDMALLOC_ALLOCATOR_REGION_H_

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "allocator/mutex.h"

namespace rdmalloc {

constexpr unsigned kPageShift = 12;
constexpr size_t kPageSize = size_t{1} << kPageShift;
constexpr int kMaxDomains = 8;  // RDMALLOC_MAX_DOMAINS

// One domain's registration of one region. Written under Region::reg_lock;
// read lock-free with a sequence count (odd while it changes). One cache
// line, and all the lookup hit path reads: the region's range is copied in
// with the keys, so a hit needs neither the region's own fields nor its seq.
struct alignas(64) RegSlot {
  enum : uint32_t { kNone = 0, kRegistered = 1, kFailed = 2 };
  // The fields a hit copies lie in rdmalloc_keys' order, in 8- and 16-byte
  // pairs (CopyUnderSeq): base and size, mr and handle, lkey and rkey; and
  // step_shift beside access, read together.
  std::atomic<uintptr_t> base{0};  // the region's, while kRegistered
  // The region's while kRegistered, else 0: a lookup's range check then
  // fails, and the hit path needs no look at `state`.
  std::atomic<size_t> size{0};
  std::atomic<void*> mr{nullptr};      // Registration::handle: the ibv_mr* on verbs
  std::atomic<void*> handle{nullptr};  // rdmalloc_keys::handle: the MR, or the ring
  std::atomic<uint32_t> lkey{0};
  std::atomic<uint32_t> rkey{0};
  // Keys step by (addr - region base) >> step_shift; kNoStep (63) when the
  // registrar's key_shift is 0 (one key for the region), so the hit path
  // computes the step with no branch. Set with the keys; 0 until then, like
  // every other byte of an unused descriptor (RegionStore's pool is .bss).
  static constexpr uint32_t kNoStep = 63;
  std::atomic<uint32_t> step_shift{0};
  static uint32_t StepShift(uint32_t key_shift) { return key_shift != 0 ? key_shift : kNoStep; }
  uint32_t key_shift() const {
    uint32_t shift = step_shift.load(std::memory_order_relaxed);
    return shift != kNoStep ? shift : 0;
  }
  std::atomic<int> access{0};  // the rights it was registered with
  std::atomic<uint32_t> seq{0};
  std::atomic<uint32_t> state{kNone};
  std::atomic<uint32_t> slots{0};
};

// Copies n bytes (8 or 16) of fields of a slot that a writer may be changing,
// between the reader's two loads of the slot's seq, which reject a torn copy.
// One load and one store for each pair of fields: a lookup hit is bound by
// its loads and stores (a core does three a cycle). ThreadSanitizer would
// call the plain copy a race, so it gets word-sized atomic loads.
template <size_t n>
__attribute__((always_inline)) inline void CopyUnderSeq(void* to, const void* from) {
  static_assert(n == 8 || n == 16, "pairs of fields");
#if defined(__SANITIZE_THREAD__)
  for (size_t i = 0; i < n / 8; i++) {
    uint64_t word = __atomic_load_n(static_cast<const uint64_t*>(from) + i, __ATOMIC_RELAXED);
    __builtin_memcpy(static_cast<char*>(to) + 8 * i, &word, 8);
  }
#else
  __builtin_memcpy(to, from, n);
#endif
}

// Page bitmaps of a region; one bit per page. Guarded by its shard's lock.
class PageMap {
 public:
  // `words` must be zeroed and hold kBitmaps * WordsFor(npages) words.
  static constexpr size_t kBitmaps = 5;
  void Init(uint64_t* words, size_t npages);
  static size_t WordsFor(size_t npages) { return (npages + 63) / 64; }

  size_t npages() const { return npages_; }
  size_t used_pages() const { return used_pages_; }

  // A place for n free pages whose first page p has (p + skew) % align == 0
  // (align in pages, a power of two): of each free run's lowest and highest
  // such place, the one with the most resident (dirty, not untouched)
  // pages, since reusing them costs no page fault; ties go to the lowest
  // address. *resident, if given, gets that count. Returns npages() if none.
  // With head_pages, only the first head_pages pages of a place count, and
  // the start of each of the first 16 runs of resident pages after a free
  // run's lowest place is a place too: for a large block whose program
  // touches only its head, a freed one's resident head is where it goes.
  size_t FindFree(size_t n, size_t align, size_t skew, size_t* resident = nullptr,
                  size_t head_pages = 0) const;
  bool IsFree(size_t first, size_t n) const;
  // Marks [first, first+n) used and dirty; returns how many of those pages
  // were resident (dirty, not untouched). *dirty, if given, gets how many
  // were dirty (0: all read as zero).
  size_t Take(size_t first, size_t n, size_t* dirty = nullptr);
  // Marks [first, first+n) free; `purged` pages read as zero again.
  void Give(size_t first, size_t n, bool purged);
  // Marks [first, first+n) free and *untouched*: past the head of a sparse
  // large block (RegionStore::EndLargeBlock), pages its program most likely
  // never touched. Not resident as far as placement and retention count,
  // yet dirty (a page may have been touched, or be swapped out) until
  // PurgeFree purges them or a Take hands them out again.
  void GiveUntouched(size_t first, size_t n);
  // What [first, first+n) was last handed out in: a small extent, a large
  // block (RegionStore's kLargeBlock), or a fresh large block (with a huge
  // page's worth of pages not yet resident), which alone gets huge pages
  // (RegionStore::set_huge_pages).
  // Pages keep their mark while free, until they are handed out again.
  enum class Block : uint8_t { kSmall, kLarge, kFreshLarge };
  void MarkBlock(size_t first, size_t n, Block b) {
    SetRange(large_, first, n, b != Block::kSmall);
    SetRange(fresh_, first, n, b == Block::kFreshLarge);
  }
  // The kind of the largest block any page of [first, first+n) was in.
  Block HeldBlock(size_t first, size_t n) const {
    if (AnySet(fresh_, first, n)) return Block::kFreshLarge;
    return AnySet(large_, first, n) ? Block::kLarge : Block::kSmall;
  }
  // Free pages that may hold bytes and are not untouched: resident memory
  // kept for reuse.
  size_t dirty_free_pages() const { return dirty_free_pages_; }
  size_t untouched_free_pages() const { return untouched_free_pages_; }
  // Calls purge(first, n) for each run of free dirty pages that are
  // resident, untouched, or either (`which`); the runs it purged (it returns
  // true) read as zero again. Stops after about max_pages. Returns the
  // resident pages purged (what retention counts).
  enum class Which { kResident, kUntouched, kAll };
  template <typename Purge>
  size_t PurgeDirtyFree(Purge purge, size_t max_pages = SIZE_MAX, Which which = Which::kResident);

 private:
  // The first page at or after p that is used (or free); npages() if none.
  size_t NextWithUsed(size_t p, bool used) const;
  bool AnySet(const uint64_t* bits, size_t first, size_t n) const;
  size_t CountSet(const uint64_t* bits, size_t first, size_t n) const;
  static void SetRange(uint64_t* bits, size_t first, size_t n, bool value);
  // The first page at or after p that is (or is not) free, dirty and of
  // `which` kind; npages() if none. A word at a time: the untouched sweep
  // runs it over every region under its shard's lock.
  size_t NextDirtyFree(size_t p, Which which, bool dirty_free) const;
  // Resident pages (dirty, not untouched) of [first, first+n).
  size_t CountResident(size_t first, size_t n) const;
  // Free dirty pages [first, first+n) were purged: they read as zero again.
  // Returns how many of them were resident.
  size_t Purged(size_t first, size_t n);
  // The first resident page in [p, end) (or the first page that is not); end if none.
  size_t NextResident(size_t p, size_t end, bool resident) const;

  uint64_t* used_ = nullptr;   // handed to jemalloc
  uint64_t* dirty_ = nullptr;  // may hold non-zero bytes
  uint64_t* large_ = nullptr;  // last handed out in a large block
  uint64_t* fresh_ = nullptr;  // ... a fresh one
  uint64_t* untouched_ = nullptr;  // free, dirty, most likely not resident
  size_t npages_ = 0;
  size_t used_pages_ = 0;
  size_t dirty_free_pages_ = 0;
  size_t untouched_free_pages_ = 0;
};

template <typename Purge>
size_t PageMap::PurgeDirtyFree(Purge purge, size_t max_pages, Which which) {
  size_t purged = 0;
  auto left = [&] {
    return (which != Which::kUntouched && dirty_free_pages_ > 0) ||
           (which != Which::kResident && untouched_free_pages_ > 0);
  };
  for (size_t p = 0; left() && purged < max_pages;) {
    p = NextDirtyFree(p, which, true);
    if (p == npages_) break;
    size_t end = NextDirtyFree(p + 1, which, false);
    if (end - p > max_pages - purged) end = p + (max_pages - purged);
    if (purge(p, end - p)) purged += Purged(p, end - p);
    p = end;
  }
  return purged;
}

struct alignas(64) Region {
  // Each domain's registration; written under reg_lock. First: the default
  // domain's slot is the one cache line a lookup hit reads.
  RegSlot reg[kMaxDomains];
  // Identity. seq is odd while the region is live (mapped, findable);
  // readers read base/size and then check that seq has not moved.
  std::atomic<uint64_t> seq{0};
  std::atomic<uintptr_t> base{0};
  std::atomic<size_t> size{0};

  // Page heap; guarded by the lock of the region store's shard it belongs to.
  PageMap pages;
  uint64_t* page_words = nullptr;
  size_t page_words_bytes = 0;
  Region* next = nullptr;  // heap's address-ordered list, or free/pending list
  // Made for one request larger than any shared region: no other extent is
  // placed in it (only in-place growth), so it is released when that one is.
  bool dedicated = false;
  // Access class (RDMALLOC_REMOTE_* bits; 0: the plain heap). A region holds
  // extents of one class only and is registered with that class's rights.
  uint8_t access_class = 0;
  // Empty, and kept (mapped, still registered) for reuse within RDMALLOC_RETAIN.
  // Written under the shard's lock; RegionStore::Drop reads it without.
  std::atomic<bool> kept{false};
  // Memory registrations of the program's own (interposed ibv_reg_mr, served
  // or forwarded) covering pages of this region: while any exists, no page is
  // purged and the region is not released. Taken and dropped without the
  // shard's lock: a release decision (RegionStore::ClaimLocked) sets
  // `closing` and then reads mr_holds, a hold adds itself and then reads
  // `closing`, both sequentially consistent, so one always sees the other.
  // A hold for an unregistered region is also taken under reg_lock, which
  // orders it with the purge in the dalloc hook (a registered region is
  // never purged anyway).
  std::atomic<int> mr_holds{0};
  std::atomic<bool> closing{false};
  // The region store's shard (its arena's) that made it and guards its pages.
  // Atomic: a scan of every descriptor (Heap::GiveBackRetained) may read it
  // while the descriptor is made anew; it then finds seq moved and stops.
  std::atomic<uint8_t> shard{0};

  // Registration. reg_lock serialises registering, deregistering, purging and
  // releasing. Hook context only ever TryLocks it (see Heap::RunRelease).
  Mutex<LockRank::kRegion> reg_lock;
  std::atomic<bool> release_wanted{false};
  std::atomic<int> registrations{0};

  uintptr_t begin() const { return base.load(std::memory_order_relaxed); }
  size_t length() const { return size.load(std::memory_order_relaxed); }
  bool Contains(uintptr_t a, size_t n) const {
    uintptr_t first = begin();
    size_t bytes = length();
    return a >= first && a - first <= bytes && n <= bytes - (a - first);
  }
};

}  // namespace rdmalloc

#endif  // RDMALLOC_ALLOCATOR_REGION_H_
