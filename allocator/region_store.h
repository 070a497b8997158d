// The region store: rdmalloc's page-level allocator under jemalloc. It maps
// regions, carves the extents jemalloc asks for out of them, takes them back
// and hands out empty regions for release. It knows nothing of registration:
// that is allocator/registrations.h's room.
//
// Sharded by jemalloc arena: each shard has its own lock, region list and
// growth state, so extents of different arenas never contend (jemalloc's
// arenas do not contend with each other either). A region belongs to the
// shard that made it for its whole life; its page map is guarded by that
// shard's lock. The descriptor pool has a lock of its own, taken only when a
// region is made or recycled. Lookups find regions through the region map
// without any lock.
#ifndef RDMALLOC_ALLOCATOR_REGION_STORE_H_
#define RDMALLOC_ALLOCATOR_REGION_STORE_H_

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "allocator/region.h"
#include "allocator/region_map.h"
#include "allocator/mutex.h"

namespace rdmalloc {

constexpr size_t kMaxRegions = 16384;
// Access classes: 0 is the plain heap, 1..7 the RDMALLOC_REMOTE_* combinations.
constexpr unsigned kAccessClasses = 8;
// Shards of region state; arena i uses shard i % kShards.
constexpr unsigned kShards = 64;
// A large block: an extent of a huge page or more, which a loop over large
// blocks would fault in again page by page if its pages were not kept.
constexpr size_t kLargeBlock = size_t{2} << 20;

class RegionStore {
 public:
  constexpr RegionStore() = default;
  RegionStore(const RegionStore&) = delete;
  RegionStore& operator=(const RegionStore&) = delete;

  // Regions grow from one chunk up to this, per shard and access class; a
  // request larger than it gets a region of its own.
  void set_region_size(size_t bytes) { region_size_ = bytes; }
  size_t region_size() const { return region_size_; }

  static unsigned ShardOf(unsigned arena) { return arena % kShards; }

  // Lock-free, no allocation, no system call.
  Region* Find(uintptr_t addr) const { return map_.Find(addr); }
  // One load, but maybe wrong: check the region's range (RegionMap::Guess).
  Region* Guess(uintptr_t addr) const { return map_.Guess(addr); }
  // The live region wholly containing [addr, addr+size), or nullptr.
  Region* RegionOf(const void* addr, size_t size) const {
    uintptr_t a = reinterpret_cast<uintptr_t>(addr);
    return IfLiveAndHolding(map_.Find(a), a, size);
  }
  // RegionOf's answer when Guess names the region, as it always does inside
  // the map's home window; else nullptr, which proves nothing (ask
  // RegionOf). For the hooks' hot path.
  Region* GuessRegionOf(const void* addr, size_t size) const {
    uintptr_t a = reinterpret_cast<uintptr_t>(addr);
    return IfLiveAndHolding(map_.Guess(a), a, size);
  }

  // r if it is live and wholly contains [a, a+size), else nullptr.
  static Region* IfLiveAndHolding(Region* r, uintptr_t a, size_t size) {
    if (r == nullptr || !(r->seq.load(std::memory_order_acquire) & 1) || !r->Contains(a, size))
      return nullptr;
    return r;
  }

  // What Carve hands out.
  struct Extent {
    Region* region = nullptr;
    void* addr = nullptr;
    bool dirty = false;  // some page may hold old bytes
    bool fresh = false;  // in a region made for it (the caller may register it)
    size_t new_pages = 0;  // pages the extent's first touch will fault in
  };
  // Pages for an extent of `arena`'s `access_class`: the fullest region of the
  // shard that fits, or a new region. With new_addr, exactly those pages
  // (jemalloc's in-place growth) if they are free in one region of the class.
  // False if none can be had.
  bool Carve(unsigned arena, unsigned access_class, void* new_addr, size_t size,
             size_t alignment, Extent* out);
  // Pages come back; the last `purged_bytes` of them read as zero again, and
  // those from `untouched_from` up to them are untouched (PageMap::
  // GiveUntouched). kEmpty: the region
  // became empty and is out of the list and the map (its seq is even, lookups
  // fail); it belongs to the caller, who releases it. kKept: it became empty
  // and is kept for reuse (RDMALLOC_RETAIN), or because memory registrations
  // hold it.
  enum class Gave { kInUse, kKept, kEmpty };
  Gave Give(Region* r, void* addr, size_t size, size_t purged_bytes = 0,
            size_t untouched_from = SIZE_MAX);
  // The largest block the extent [addr, addr+size) of r, still handed out,
  // holds part of (a large block: a request of kLargeBlock or more).
  PageMap::Block HeldBlock(Region* r, const void* addr, size_t size);
  // An extent holding a large block (`held` is not kSmall), before Give (its
  // pages still the caller's, so no Carve can advise them meanwhile): notes
  // in its shard whether the program filled it (one mincore on its middle
  // 1 MiB) and takes a fresh large block's huge-page advice back. Returns
  // the bytes at its start worth keeping resident: all of it, but of a
  // sparse one (less than a quarter of its middle resident), with
  // `find_head`, its head: up to the last resident page of
  // its first MiB, or while the MiBs after that are at least half resident,
  // to the end of those (one mincore per MiB). The page map counts every page
  // handed out as resident: a program that writes 64 KiB of each 16 MiB
  // buffer, as one sized for its largest message, left 16 MiB counted as
  // kept for 64 KiB resident, and purges forced by that count took the pages
  // it does touch (sparse_blocks at 2 threads: 7.5 page faults per block).
  // `pinned`: a registration pins r's pages, so all are resident (filled)
  // without asking the kernel.
  size_t EndLargeBlock(Region* r, void* addr, size_t size, PageMap::Block held, bool find_head,
                       bool pinned);
  // Whether the shard's last freed large block was sparse: its next one
  // will not fault in all its new pages either.
  bool LargeBlocksSparse(const Region* r) const {
    return shards_[r->shard].last_large_block.load(std::memory_order_relaxed) ==
           LargeBlockUse::kSparse;
  }

  // Holds of the program's memory registrations (Region::mr_holds). Hold
  // fails if r is no longer live. Drop returns kEmpty if r, empty and past
  // the retention bound, was kept only for its holds: it is then the
  // caller's to release.
  // Inline: a served MR takes and drops one on its registration's path.
  __attribute__((always_inline)) bool Hold(Region* r) {
    r->mr_holds.fetch_add(1);
    if (!r->closing.load() && (r->seq.load() & 1)) return true;
    r->mr_holds.fetch_sub(1);  // being released, or gone: a release that saw us gave up
    return false;
  }
  __attribute__((always_inline)) Gave Drop(Region* r) {
    if (r->mr_holds.fetch_sub(1) > 1) return Gave::kInUse;
    // Not empty: whoever empties it decides (Give reads the holds after it
    // sets `kept`, and this reads `kept` after the holds fell to 0).
    if (!r->kept.load()) return Gave::kInUse;
    return DropLast(r);
  }
  // Releases put off because memory registrations held the region: an empty
  // region kept past RDMALLOC_RETAIN, or skipped by a purge or trim.
  uint64_t releases_held() const { return releases_held_.load(std::memory_order_relaxed); }

  // Transparent huge pages for large blocks (RDMALLOC_HUGEPAGES): regions
  // are made MADV_NOHUGEPAGE; while the shard's last freed large block was
  // mostly resident (EndLargeBlock), a carve of kLargeBlock or more with at
  // least a huge page's worth of pages not resident (a *fresh large block*:
  // its first touch faults them in) advises its whole 2 MiB pages
  // MADV_HUGEPAGE, and EndLargeBlock advises them back before the pages are
  // free again. Only pages of one extent share a huge page, so the page
  // map's count of resident free pages stays exact. A program that touches
  // little of its large blocks (sort's 28 MiB buffer of which it fills
  // 1 MiB) would otherwise hold 2 MiB per page touched. Other large blocks
  // cost no advice: for resident pages it would change nothing, and each
  // madvise of a range's flags costs system calls (a loop over one
  // untouched 16 MiB block took 8.5 us per block undoing advice it never got).
  void set_huge_pages(bool on) { huge_pages_ = on; }

  // Retention (RDMALLOC_RETAIN): free pages not purged, and empty regions
  // kept, count against this many bytes.
  void set_retain(size_t bytes) { retain_ = bytes; }
  uint64_t retained_bytes() const { return retained_pages_.load(std::memory_order_relaxed) << kPageShift; }
  bool OverRetain() const { return retained_bytes() > retain_; }
  // How far `extra` more free bytes left resident would pass the bound.
  size_t ExcessOverRetain(size_t extra) const {
    uint64_t after = retained_bytes() + extra;
    return after > retain_ ? static_cast<size_t>(after - retain_) : 0;
  }
  // Idle retention: the fewest pages kept at any moment of an epoch were
  // not reused during it. Once `epoch_ns` has passed since the epoch began,
  // one caller gets true and that count in *idle_pages, to purge (the others
  // false), and the next epoch begins.
  bool EndIdleEpoch(uint64_t now_ns, uint64_t epoch_ns, uint64_t* idle_pages);
  // True for one caller once `interval_ns` has passed since the last time,
  // or once `gives` frees have given back untouched pages since then.
  bool SweepDue(uint64_t now_ns, uint64_t interval_ns, uint64_t gives);
  // Free untouched pages (PageMap::GiveUntouched) over all regions: while
  // none exist, a sweep need not visit every region.
  uint64_t untouched_bytes() const {
    return untouched_pages_.load(std::memory_order_relaxed) << kPageShift;
  }
  // A kept region of `shard` to release while retention is over its bound
  // (then out of list and map, as for kEmpty), or nullptr.
  Region* ShedKept(unsigned shard);
  // Any kept region, to release now (purge, trim), or nullptr.
  Region* TakeKept();
  // Purges r's free pages that are still resident; r->reg_lock held and r
  // not registered. `seq` is r->seq as the caller found it live: if r was
  // released and made anew since, nothing is purged. At most about
  // max_bytes (whole pages, lowest first). Returns the bytes purged.
  // `which`: resident pages (what retention counts), untouched ones, or both.
  size_t PurgeFree(Region* r, uint64_t seq, size_t max_bytes = SIZE_MAX,
                   PageMap::Which which = PageMap::Which::kResident);
  // Unmaps an empty region handed out by Give and recycles its descriptor.
  void Unmap(Region* r);

  // Descriptors ever used (the pool never shrinks; scans go up to this).
  size_t descriptors_used() const { return descriptors_used_.load(std::memory_order_acquire); }
  Region* descriptor(size_t i) { return &pool_[i]; }

  // FreeExtent calls under way, over all shards (AddObserver waits for 0).
  // EnterFree returns the shard to pass to LeaveFree: by then the region may
  // be released and its descriptor in another shard's hands.
  unsigned EnterFree(const Region* r) {
    shards_[r->shard].hook_busy.fetch_add(1);
    return r->shard;
  }
  void LeaveFree(unsigned shard) { shards_[shard].hook_busy.fetch_sub(1); }
  bool FreesUnderWay() const;

  // r's page counts under its shard's lock; false if r is not live.
  bool ReadPages(Region* r, size_t* pages, size_t* in_use);

  // Counters (relaxed reads; see rdmalloc_stats).
  uint64_t bytes_mapped() const { return bytes_mapped_.load(std::memory_order_acquire); }
  uint64_t bytes_in_use() const;
  uint64_t regions_created() const { return regions_created_.load(std::memory_order_relaxed); }
  uint64_t regions_released() const { return regions_released_.load(std::memory_order_relaxed); }
  // Lock contention: acquisitions of shard locks that found them held.
  uint64_t shard_lock_waits() const;

  // Fork stage kHeap: every shard lock and the pool lock.
  void LockAllForFork();
  void UnlockAllAfterFork();
  void ResetAfterFork();

 private:
  Gave DropLast(Region* r);
  enum class LargeBlockUse : uint8_t { kUnknown, kFilled, kPartial, kSparse };
  struct alignas(64) Shard {
    Mutex<LockRank::kHeap> lock;
    Region* regions = nullptr;  // by address
    // A shared region of each access class is kChunkSize << doublings[class]
    // bytes, up to region_size_: the first regions stay small.
    uint8_t doublings[kAccessClasses] = {};
    std::atomic<uint64_t> pages_in_use{0};
    std::atomic<int> hook_busy{0};
    std::atomic<LargeBlockUse> last_large_block{LargeBlockUse::kUnknown};  // EndLargeBlock
    std::atomic<uint64_t> lock_waits{0};
  };

  void LockShard(Shard& s);
  Region* NewRegion(unsigned shard, size_t size, size_t alignment, unsigned access_class);
  // With the shard locked: pages of r taken / given, r unlisted.
  // Returns how many of the pages were resident (or pinned: all of them).
  // *fresh_large: the pages are a fresh large block.
  size_t TakePagesLocked(Shard& s, Region* r, size_t first, size_t n, bool* dirty,
                         bool* fresh_large);
  void UnlistLocked(Shard& s, Region* r);
  // What n pages handed out together in shard s are, new_pages of them not
  // resident: a fresh large block only while s's large blocks are filled
  // (set_huge_pages), since only those are advised.
  PageMap::Block BlockOf(const Shard& s, size_t n, size_t new_pages) const;
  // Fewer pages retained: the epoch's floor follows them down.
  void Unretain(uint64_t pages);
  void CountHeldLocked(Shard& s);
  // A kept region of s, claimed for release and taken out of list and map
  // (as for kEmpty), or nullptr. Takes s's lock.
  Region* ClaimKept(Shard& s);
  // A release decision on an empty region, shard lock held: true unless an
  // MR holds it (then a Hold racing with it may fail instead; it retries as
  // forwarded).
  bool ClaimLocked(Region* r);
  Region* KeptDedicatedLocked(Shard& s, unsigned access_class, size_t size, size_t alignment);
  Region* TakeDescriptor();
  void Recycle(Region* r);

  // What a program's first malloc writes lies at the two ends of the large
  // tables, a page each (Heap says why): the first descriptors of the pool
  // beside the heap's own state, and after the region map (whose last member
  // is the window's end) the scalars, the pool's head and the shards, a
  // program's first shard the first of them.
  Region pool_[kMaxRegions];
  RegionMap map_;
  // Set before the first Carve (Heap::Configure). Zero until then, as is
  // every member: the heap holding this store is constant-initialised to
  // zero bytes, into .bss (ConfigSlot says why that matters).
  size_t region_size_ = 0;
  size_t retain_ = 0;
  bool huge_pages_ = false;
  std::atomic<uint64_t> retained_pages_{0}, untouched_pages_{0};
  std::atomic<uint64_t> idle_floor_pages_{0}, idle_epoch_start_ns_{0}, last_sweep_ns_{0};
  std::atomic<uint64_t> untouched_gives_{0};  // since the last sweep
  Mutex<LockRank::kHeap> pool_lock_;  // never held with a shard lock
  Region* free_descriptors_ = nullptr;
  std::atomic<size_t> descriptors_used_{0};
  std::atomic<uint64_t> bytes_mapped_{0}, regions_created_{0}, regions_released_{0},
      releases_held_{0};
  Shard shards_[kShards];
};

}  // namespace rdmalloc

#endif  // RDMALLOC_ALLOCATOR_REGION_STORE_H_
