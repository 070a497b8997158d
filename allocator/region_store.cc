#include "allocator/region_store.h"

#include <sched.h>
#include <sys/mman.h>

#include <algorithm>
#include <cstring>

namespace rdmalloc {
namespace {

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

// madvise of the whole 2 MiB pages inside [addr, addr+size). An error (no
// THP in this kernel, or no room for another mapping) leaves 4 KiB pages,
// which are always right.
void AdviseWholeChunks(const void* addr, size_t size, int advice) {
  uintptr_t a = reinterpret_cast<uintptr_t>(addr);
  uintptr_t first = RoundUp(a, kChunkSize), end = (a + size) & ~(kChunkSize - 1);
  if (end > first) madvise(reinterpret_cast<void*>(first), end - first, advice);
}

constexpr size_t kWindowPages = 256;  // 1 MiB

// Resident pages of the n <= kWindowPages pages at addr, SIZE_MAX if
// unknown; *end, if given, gets one past the last resident one.
// mincore's bytes are read 8 at a time (bit 0 of each: resident; the other
// bits are undefined): a byte loop was a fifth of sparse_blocks'
// instructions under callgrind.
size_t ResidentPages(const char* addr, size_t n, size_t* end = nullptr) {
  static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "page i+7 is the high byte");
  constexpr uint64_t kLowBits = 0x0101010101010101ull;
  unsigned char vec[kWindowPages];
  if (mincore(const_cast<char*>(addr), n << kPageShift, vec) != 0) return SIZE_MAX;
  size_t resident = 0, last = 0, i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t bytes;
    memcpy(&bytes, vec + i, 8);
    bytes &= kLowBits;
    if (bytes == 0) continue;
    resident += (bytes * kLowBits) >> 56;  // the sum of the eight 0/1 bytes
    last = i + (63 - __builtin_clzll(bytes)) / 8 + 1;
  }
  for (; i < n; i++) {
    if (vec[i] & 1) resident++, last = i + 1;
  }
  if (end != nullptr && resident != 0) *end = last;
  return resident;
}

// The resident pages of the 1 MiB in the middle of [addr, addr+size) (the
// whole of it if smaller), and how many pages that is: one system call (a
// syscall costs 1.4 us on a PVM guest, where 16 samples took 23 us per freed
// block), and a block filled from either end reads as filled once the fill
// passes its middle. Unknown reads as filled.
size_t MiddleResident(const char* addr, size_t size, size_t* n) {
  size_t pages = size >> kPageShift;
  *n = std::min(kWindowPages, pages);
  size_t resident = ResidentPages(addr + (((pages - *n) / 2) << kPageShift), *n);
  return resident == SIZE_MAX ? *n : resident;
}

// The head of a sparse block [addr, addr+size) that its program wrote: up
// to the last resident page of its first MiB, or while the MiBs after it
// are at least half resident, up to the last of those (one mincore per
// MiB). Pages beyond may be resident too (left by earlier blocks there, or
// a byte written far off): they come back untouched, for the sweep. Not a
// scan of every page: mincore costs about 4 ns per page, 20 us per freed
// 20 MiB block on this PVM guest, more than the faults it saved.
size_t ResidentHead(const char* addr, size_t size) {
  constexpr size_t kStep = kWindowPages << kPageShift;
  size_t end = 0;
  size_t resident = ResidentPages(addr, std::min(kStep, size) >> kPageShift, &end);
  if (resident == SIZE_MAX) return size;  // unknown: keep it all
  if (resident == 0) return 0;
  size_t head = kStep;
  while (head < size) {
    size_t n = std::min(kStep, size - head) >> kPageShift;
    resident = ResidentPages(addr + head, n);
    if (resident == SIZE_MAX) return size;
    if (resident * 2 < n) break;
    head += n << kPageShift;
  }
  if (head == kStep) return std::min(size, end << kPageShift);
  return std::min(size, head);
}

}  // namespace

// Counts the acquisitions that had to wait: the thread-scaling benchmark
// reports them (shard_lock_waits in rdmalloc_stats).
void RegionStore::LockShard(Shard& s) {
  if (s.lock.TryLock()) return;
  s.lock_waits.fetch_add(1, std::memory_order_relaxed);
  s.lock.Lock();
}

bool RegionStore::Carve(unsigned arena, unsigned access_class, void* new_addr, size_t size,
                        size_t alignment, Extent* out) {
  if (size == 0 || (size & (kPageSize - 1)) != 0) return false;
  size_t n = size >> kPageShift;
  size_t align = alignment > kPageSize ? alignment >> kPageShift : 1;
  Region* r = nullptr;
  size_t first = 0;
  bool dirty = false, fresh_large = false;
  if (new_addr != nullptr) {
    // In-place growth: only if those exact pages are free in one region of
    // the arena's own shard (extents of different arenas share no region).
    uintptr_t a = reinterpret_cast<uintptr_t>(new_addr);
    Region* c = RegionOf(new_addr, size);
    if (c == nullptr || c->access_class != access_class || c->shard != ShardOf(arena) ||
        a % (align << kPageShift) != 0)
      return false;
    Shard& s = shards_[c->shard];
    LockShard(s);
    // Still live (a region is unlisted only under its shard's lock).
    first = (a - c->begin()) >> kPageShift;
    if ((c->seq.load() & 1) && c->pages.IsFree(first, n)) {
      r = c;
      out->new_pages = n - TakePagesLocked(s, r, first, n, &dirty, &fresh_large);
    }
    s.lock.Unlock();
    if (r == nullptr) return false;
  } else {
    unsigned shard = ShardOf(arena);
    Shard& s = shards_[shard];
    LockShard(s);
    if (size > region_size_) {
      // A request of its own size: a kept dedicated region that fits.
      r = KeptDedicatedLocked(s, access_class, size, alignment);
    } else {
      // Most resident pages first (reusing them costs no page fault), then
      // the fullest region: busy regions pack tighter and nearly empty ones
      // drain, so they can be released (a region is only released whole);
      // ties go to the lower address. A registered region is resident
      // throughout (pinned), so among registered regions the fullest wins.
      size_t best_resident = 0, best_free = SIZE_MAX;
      // A sparse large block wants a freed one's resident head where it starts.
      size_t head_pages = (size >= kLargeBlock && s.last_large_block.load(std::memory_order_relaxed) ==
                                                      LargeBlockUse::kSparse)
                              ? kWindowPages
                              : 0;
      for (Region* c = s.regions; c != nullptr; c = c->next) {
        size_t free_pages = c->pages.npages() - c->pages.used_pages();
        if (c->dedicated || c->access_class != access_class || free_pages < n) continue;
        bool pinned = c->registrations.load(std::memory_order_relaxed) > 0;
        if (r != nullptr && !pinned && c->pages.dirty_free_pages() < best_resident) continue;
        size_t skew = (c->begin() >> kPageShift) & (align - 1);
        size_t resident = 0;
        size_t at = c->pages.FindFree(n, align, skew, &resident, head_pages);
        if (at >= c->pages.npages()) continue;
        if (pinned) resident = n;
        if (r == nullptr || resident > best_resident ||
            (resident == best_resident && free_pages < best_free)) {
          r = c;
          first = at;
          best_resident = resident;
          best_free = free_pages;
        }
      }
    }
    if (r != nullptr) out->new_pages = n - TakePagesLocked(s, r, first, n, &dirty, &fresh_large);
    s.lock.Unlock();
    if (r == nullptr) {
      r = NewRegion(shard, size, alignment, access_class);
      if (r == nullptr) return false;
      out->fresh = true;
      out->new_pages = n;
      fresh_large = BlockOf(shards_[shard], n, n) == PageMap::Block::kFreshLarge;
    }
  }
  out->region = r;
  out->addr = reinterpret_cast<void*>(r->begin() + (first << kPageShift));
  out->dirty = dirty;
  // A large block faults in 2 MiB at a time (a loop over 1-32 MiB blocks
  // faulted 8x fewer times and ran 4-5x faster). Outside the lock: the
  // pages are ours now.
  if (fresh_large) AdviseWholeChunks(out->addr, size, MADV_HUGEPAGE);
  return true;
}

Region* RegionStore::TakeDescriptor() {
  LockGuard g(pool_lock_);
  if (free_descriptors_ != nullptr) {
    Region* r = free_descriptors_;
    free_descriptors_ = r->next;
    return r;
  }
  size_t used = descriptors_used_.load(std::memory_order_relaxed);
  if (used >= kMaxRegions) return nullptr;
  // Published after the descriptor is counted: scans up to descriptors_used()
  // may meet it not yet live (seq even), which they skip.
  descriptors_used_.store(used + 1, std::memory_order_release);
  return &pool_[used];
}

// A fresh region whose first pages are carved for the request (they are clean).
Region* RegionStore::NewRegion(unsigned shard, size_t size, size_t alignment,
                               unsigned access_class) {
  Shard& s = shards_[shard];
  size_t grow;
  {
    LockGuard g(s.lock);
    grow = std::min(kChunkSize << s.doublings[access_class], region_size_);
  }
  // A shared region has room for the request and as much again, up to the
  // largest shared region: one made just big enough for a large block holds
  // nothing else, and once that block is freed fits no larger one, so a loop
  // over large blocks would spread them over many half-used regions.
  size_t bytes = RoundUp(size, kChunkSize);
  if (size <= region_size_) bytes = std::min(region_size_, std::max(grow, 2 * bytes));
  size_t align = alignment > kChunkSize ? alignment : kChunkSize;
  void* mem = MapAligned(bytes, align);
  if (mem == nullptr) return nullptr;
  // No huge page unless a large block asks (Carve): under THP "always" a
  // small extent's first touch would otherwise fault in 2 MiB, most of it
  // free pages the page map counts as never touched.
  if (huge_pages_) madvise(mem, bytes, MADV_NOHUGEPAGE);
  size_t npages = bytes >> kPageShift;
  size_t words_bytes =
      RoundUp(PageMap::kBitmaps * PageMap::WordsFor(npages) * sizeof(uint64_t), kPageSize);
  // Populated: the first carve reads the bitmaps and then writes them, a
  // fault for each (the zero page, then a page of its own).
  void* words = mmap(nullptr, words_bytes, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
  Region* r = words != MAP_FAILED ? TakeDescriptor() : nullptr;
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
  r->dedicated = size > region_size_;
  r->access_class = static_cast<uint8_t>(access_class);
  r->shard = static_cast<uint8_t>(shard);
  if (!map_.Set(r->begin(), bytes, r)) {
    // No memory for a map leaf: memory nobody can find must not be handed out.
    munmap(mem, bytes);
    Recycle(r);
    return nullptr;
  }
  // Mapped before in use, so a concurrent stats reader never sees more bytes
  // in use than mapped (Unmap subtracts after the last page came back).
  bytes_mapped_.fetch_add(bytes, std::memory_order_release);
  r->pages.Take(0, size >> kPageShift);  // fresh pages: clean
  r->pages.MarkBlock(0, size >> kPageShift, BlockOf(s, size >> kPageShift, size >> kPageShift));
  r->kept.store(false, std::memory_order_relaxed);
  // mr_holds is 0 here, but for a stale Hold of the descriptor's last life
  // that is about to give its hold back: not reset, so the two cancel out.
  r->closing.store(false, std::memory_order_relaxed);
  // Live from here on: a concurrent RemoveDomain scan sees it (seq_cst).
  r->seq.fetch_add(1);
  {
    LockGuard g(s.lock);
    Region** link = &s.regions;
    while (*link != nullptr && (*link)->begin() < r->begin()) link = &(*link)->next;
    r->next = *link;
    *link = r;
    s.pages_in_use.fetch_add(size >> kPageShift, std::memory_order_relaxed);
    if ((kChunkSize << s.doublings[access_class]) < region_size_) s.doublings[access_class]++;
  }
  regions_created_.fetch_add(1, std::memory_order_relaxed);
  return r;
}

void RegionStore::Unretain(uint64_t pages) {
  if (pages == 0) return;
  uint64_t now = retained_pages_.fetch_sub(pages, std::memory_order_relaxed) - pages;
  uint64_t floor = idle_floor_pages_.load(std::memory_order_relaxed);
  while (now < floor && !idle_floor_pages_.compare_exchange_weak(floor, now, std::memory_order_relaxed)) {
  }
}

bool RegionStore::EndIdleEpoch(uint64_t now_ns, uint64_t epoch_ns, uint64_t* idle_pages) {
  uint64_t start = idle_epoch_start_ns_.load(std::memory_order_relaxed);
  if (now_ns - start < epoch_ns ||
      !idle_epoch_start_ns_.compare_exchange_strong(start, now_ns, std::memory_order_relaxed))
    return false;
  uint64_t retained = retained_pages_.load(std::memory_order_relaxed);
  uint64_t idle = idle_floor_pages_.exchange(retained, std::memory_order_relaxed);
  *idle_pages = idle < retained ? idle : retained;
  return true;
}

bool RegionStore::SweepDue(uint64_t now_ns, uint64_t interval_ns, uint64_t gives) {
  uint64_t last = last_sweep_ns_.load(std::memory_order_relaxed);
  if (now_ns - last < interval_ns && untouched_gives_.load(std::memory_order_relaxed) < gives)
    return false;
  if (!last_sweep_ns_.compare_exchange_strong(last, now_ns, std::memory_order_relaxed))
    return false;
  untouched_gives_.store(0, std::memory_order_relaxed);
  return true;
}

PageMap::Block RegionStore::BlockOf(const Shard& s, size_t n, size_t new_pages) const {
  if ((n << kPageShift) < kLargeBlock) return PageMap::Block::kSmall;
  bool fresh = huge_pages_ && (new_pages << kPageShift) >= kChunkSize &&
               s.last_large_block.load(std::memory_order_relaxed) == LargeBlockUse::kFilled;
  return fresh ? PageMap::Block::kFreshLarge : PageMap::Block::kLarge;
}

size_t RegionStore::TakePagesLocked(Shard& s, Region* r, size_t first, size_t n, bool* dirty,
                                    bool* fresh_large) {
  size_t dirty_pages = 0;
  size_t untouched = r->pages.untouched_free_pages();
  size_t resident_pages = r->pages.Take(first, n, &dirty_pages);
  untouched_pages_.fetch_sub(untouched - r->pages.untouched_free_pages(), std::memory_order_relaxed);
  size_t resident = r->registrations.load(std::memory_order_relaxed) > 0 ? n : resident_pages;
  PageMap::Block block = BlockOf(s, n, n - resident);
  r->pages.MarkBlock(first, n, block);
  *fresh_large = block == PageMap::Block::kFreshLarge;
  *dirty = dirty_pages != 0;
  Unretain(resident_pages);
  s.pages_in_use.fetch_add(n, std::memory_order_relaxed);
  r->kept.store(false, std::memory_order_relaxed);
  return resident;
}

// A kept dedicated region for a request of `size`: large enough, not more
// than twice as large (it is all pinned for one allocation), aligned.
Region* RegionStore::KeptDedicatedLocked(Shard& s, unsigned access_class, size_t size,
                                         size_t alignment) {
  Region* best = nullptr;
  for (Region* c = s.regions; c != nullptr; c = c->next) {
    if (!c->kept.load(std::memory_order_relaxed) || !c->dedicated || c->access_class != access_class || c->length() < size ||
        c->length() / 2 > size || c->begin() % (alignment > kPageSize ? alignment : kPageSize) != 0)
      continue;
    if (best == nullptr || c->length() < best->length()) best = c;
  }
  return best;
}

void RegionStore::UnlistLocked(Shard& s, Region* r) {
  Region** link = &s.regions;
  while (*link != r) link = &(*link)->next;
  *link = r->next;
  map_.Clear(r->begin(), r->length());
  r->seq.fetch_add(1);  // even: lookups that raced with us now fail
  Unretain(r->pages.dirty_free_pages());
  untouched_pages_.fetch_sub(r->pages.untouched_free_pages(), std::memory_order_relaxed);
  r->kept.store(false, std::memory_order_relaxed);
}

bool RegionStore::ClaimLocked(Region* r) {
  r->closing.store(true);  // sequentially consistent: before the load below
  if (r->mr_holds.load() == 0) return true;
  r->closing.store(false, std::memory_order_relaxed);
  return false;
}

RegionStore::Gave RegionStore::Give(Region* r, void* addr, size_t size, size_t purged_bytes,
                                    size_t untouched_from) {
  size_t first = (reinterpret_cast<uintptr_t>(addr) - r->begin()) >> kPageShift;
  size_t n = size >> kPageShift;
  size_t purged = purged_bytes >> kPageShift;
  size_t kept = std::min(n - purged, untouched_from >> kPageShift);
  Shard& s = shards_[r->shard];
  LockShard(s);
  if (kept > 0) r->pages.Give(first, kept, false);
  if (n - purged > kept) {
    r->pages.GiveUntouched(first + kept, n - purged - kept);
    untouched_pages_.fetch_add(n - purged - kept, std::memory_order_relaxed);
    untouched_gives_.fetch_add(1, std::memory_order_relaxed);
  }
  if (purged > 0) r->pages.Give(first + n - purged, purged, true);
  retained_pages_.fetch_add(kept, std::memory_order_relaxed);
  s.pages_in_use.fetch_sub(n, std::memory_order_relaxed);
  Gave gave = Gave::kInUse;
  if (r->pages.used_pages() == 0) {
    // Kept while what is kept stays within RDMALLOC_RETAIN (its resident
    // pages counted already): the next request of the shard reuses it, with
    // its pages and registrations, instead of mapping a new region. Marked
    // kept before the holds are read: a Drop of the last hold meanwhile
    // either is seen here or sees `kept` and releases it itself.
    r->kept.store(true);
    gave = Gave::kKept;
    if (OverRetain()) {
      if (ClaimLocked(r)) {
        UnlistLocked(s, r);
        gave = Gave::kEmpty;
      } else {
        releases_held_.fetch_add(1, std::memory_order_relaxed);
      }
    }
  }
  s.lock.Unlock();
  return gave;
}

PageMap::Block RegionStore::HeldBlock(Region* r, const void* addr, size_t size) {
  size_t first = (reinterpret_cast<uintptr_t>(addr) - r->begin()) >> kPageShift;
  Shard& s = shards_[r->shard];
  LockShard(s);
  PageMap::Block block = r->pages.HeldBlock(first, size >> kPageShift);
  s.lock.Unlock();
  return block;
}

size_t RegionStore::EndLargeBlock(Region* r, void* addr, size_t size, PageMap::Block held,
                                  bool find_head, bool pinned) {
  const char* a = static_cast<const char*>(addr);
  // Filled: at least half of its middle resident. Sparse: less than a
  // quarter (a buffer written from its start, not far, over pages other
  // blocks may have left resident: with a sixteenth, sparse_blocks faulted
  // 1.7x as often); one in between (a table touched here and there) is kept
  // whole, as before. Pinned pages are all resident: no mincore, whose
  // system call cost a loop over registered 16 MiB blocks 2.4 us per block
  // and, on a kernel that flushes the TLB at every system call, made the
  // program's next ibv_reg_mr 2.5x slower.
  LargeBlockUse use = LargeBlockUse::kFilled;
  if (!pinned) {
    size_t n = 0, resident = MiddleResident(a, size, &n);
    use = resident * 2 >= n  ? LargeBlockUse::kFilled
          : resident * 4 < n ? LargeBlockUse::kSparse
                             : LargeBlockUse::kPartial;
  }
  shards_[r->shard].last_large_block.store(use, std::memory_order_relaxed);
  if (held == PageMap::Block::kFreshLarge) AdviseWholeChunks(addr, size, MADV_NOHUGEPAGE);
  return use == LargeBlockUse::kSparse && find_head ? ResidentHead(a, size) : size;
}

// A release wanted but put off: kept empty regions that MRs still hold.
void RegionStore::CountHeldLocked(Shard& s) {
  for (Region* c = s.regions; c != nullptr; c = c->next) {
    if (c->kept.load(std::memory_order_relaxed) && c->mr_holds.load() > 0)
      releases_held_.fetch_add(1, std::memory_order_relaxed);
  }
}

// The last hold of an empty region went. Hold and Drop take no shard lock: a served
// ibv_reg_mr/ibv_dereg_mr pair costs two atomics there. See Region::mr_holds
// for why no release can pass a hold unseen.
RegionStore::Gave RegionStore::DropLast(Region* r) {
  Shard& s = shards_[r->shard];
  LockGuard g(s.lock);
  // In use again, released meanwhile, or within the bound.
  if (!r->kept.load(std::memory_order_relaxed) || !(r->seq.load() & 1)) return Gave::kInUse;
  if (!OverRetain()) return Gave::kKept;
  if (!ClaimLocked(r)) return Gave::kInUse;  // held again
  UnlistLocked(s, r);
  return Gave::kEmpty;
}

Region* RegionStore::ClaimKept(Shard& s) {
  LockShard(s);
  Region* r = s.regions;
  while (r != nullptr && !(r->kept.load(std::memory_order_relaxed) && ClaimLocked(r))) r = r->next;
  if (r != nullptr) UnlistLocked(s, r);
  else CountHeldLocked(s);
  s.lock.Unlock();
  return r;
}

Region* RegionStore::ShedKept(unsigned shard) {
  return OverRetain() ? ClaimKept(shards_[shard]) : nullptr;
}

Region* RegionStore::TakeKept() {
  for (Shard& s : shards_) {
    if (Region* r = ClaimKept(s)) return r;
  }
  return nullptr;
}

size_t RegionStore::PurgeFree(Region* r, uint64_t seq, size_t max_bytes, PageMap::Which which) {
  Shard& s = shards_[r->shard.load(std::memory_order_relaxed)];
  LockGuard g(s.lock);
  // The same life of the descriptor, so also the shard just locked.
  if (r->seq.load() != seq || !(seq & 1) || r->mr_holds.load() > 0) return 0;
  size_t max_pages = max_bytes == SIZE_MAX ? SIZE_MAX : (max_bytes + kPageSize - 1) >> kPageShift;
  size_t untouched = r->pages.untouched_free_pages();
  size_t purged = r->pages.PurgeDirtyFree(
      [r](size_t first, size_t n) {
        return madvise(reinterpret_cast<void*>(r->begin() + (first << kPageShift)),
                       n << kPageShift, MADV_DONTNEED) == 0;
      },
      max_pages, which);
  Unretain(purged);
  untouched_pages_.fetch_sub(untouched - r->pages.untouched_free_pages(), std::memory_order_relaxed);
  return purged << kPageShift;
}

void RegionStore::Unmap(Region* r) {
  munmap(reinterpret_cast<void*>(r->begin()), r->length());
  bytes_mapped_.fetch_sub(r->length(), std::memory_order_relaxed);
  regions_released_.fetch_add(1, std::memory_order_relaxed);
  Recycle(r);
}

void RegionStore::Recycle(Region* r) {
  munmap(r->page_words, r->page_words_bytes);
  r->page_words = nullptr;
  r->base.store(0, std::memory_order_relaxed);
  r->size.store(0, std::memory_order_relaxed);
  LockGuard g(pool_lock_);
  r->next = free_descriptors_;
  free_descriptors_ = r;
}

bool RegionStore::ReadPages(Region* r, size_t* pages, size_t* in_use) {
  // A descriptor that is not live may be set up by NewRegion right now; a
  // live one's page map only changes under its shard's lock.
  if (!(r->seq.load() & 1)) return false;
  Shard& s = shards_[r->shard];
  LockGuard g(s.lock);
  if (!(r->seq.load() & 1)) return false;
  *pages = r->pages.npages();
  *in_use = r->pages.used_pages();
  return true;
}

bool RegionStore::FreesUnderWay() const {
  for (const Shard& s : shards_) {
    if (s.hook_busy.load() != 0) return true;
  }
  return false;
}

uint64_t RegionStore::bytes_in_use() const {
  uint64_t pages = 0;
  for (const Shard& s : shards_) pages += s.pages_in_use.load(std::memory_order_relaxed);
  return pages << kPageShift;
}

uint64_t RegionStore::shard_lock_waits() const {
  uint64_t waits = 0;
  for (const Shard& s : shards_) waits += s.lock_waits.load(std::memory_order_relaxed);
  return waits;
}

// Nobody else ever holds two of these locks, so taking them all in one order
// (shards by index, then the pool) cannot deadlock; waiting for each asleep
// lets its holder run (yielding in a loop burnt a core for as long).
void RegionStore::LockAllForFork() {
  for (Shard& s : shards_) s.lock.LockInSeries();
  pool_lock_.LockInSeries();
}

void RegionStore::UnlockAllAfterFork() {
  pool_lock_.Unlock();
  for (Shard& s : shards_) s.lock.Unlock();
}

void RegionStore::ResetAfterFork() {
  pool_lock_.ResetAfterFork();
  for (Shard& s : shards_) {
    s.lock.ResetAfterFork();
    s.hook_busy.store(0, std::memory_order_relaxed);
  }
}

}  // namespace rdmalloc
