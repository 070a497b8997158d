#include "allocator/region.h"

#include <algorithm>
#include <atomic>
#include <cstddef>

#if defined(__x86_64__) && defined(__has_include)
#if __has_include(<sys/platform/x86.h>)
#define _Bool bool  // a C header: clang's C++ has no _Bool
#include <sys/platform/x86.h>
#undef _Bool
#endif
#endif

namespace rdmalloc {

static_assert(offsetof(Region, reg) == 0 && sizeof(RegSlot) == 64,
              "a lookup hit reads one cache line: the default domain's slot");

void PageMap::Init(uint64_t* words, size_t npages) {
  used_ = words;
  dirty_ = words + WordsFor(npages);
  large_ = words + 2 * WordsFor(npages);
  fresh_ = words + 3 * WordsFor(npages);
  untouched_ = words + 4 * WordsFor(npages);
  npages_ = npages;
  used_pages_ = 0;
  dirty_free_pages_ = 0;
  untouched_free_pages_ = 0;
}

namespace {

// Bits [b, e) of a word, 0 <= b < e <= 64.
inline uint64_t Bits(size_t b, size_t e) {
  uint64_t high = e == 64 ? ~uint64_t{0} : (uint64_t{1} << e) - 1;
  return high & (~uint64_t{0} << b);
}

// The set bits for pages [first, first+n) of a bitmap whose i-th word is
// word(i). Inlined into each build of its callers (see ChooseCounts).
template <typename Word>
__attribute__((always_inline)) inline size_t CountBits(size_t first, size_t n, Word word) {
  if (n == 0) return 0;
  size_t end = first + n, w = first / 64, last = (end - 1) / 64;
  if (w == last) return static_cast<size_t>(__builtin_popcountll(word(w) & Bits(first % 64, end - w * 64)));
  size_t count = static_cast<size_t>(__builtin_popcountll(word(w) & Bits(first % 64, 64)));
  for (size_t i = w + 1; i < last; i++) count += static_cast<size_t>(__builtin_popcountll(word(i)));
  return count + static_cast<size_t>(__builtin_popcountll(word(last) & Bits(0, end - last * 64)));
}

// The first page in [p, end) whose bit is set in word(i); end if none.
template <typename Word>
inline size_t NextBit(size_t p, size_t end, Word word) {
  while (p < end) {
    uint64_t w = word(p / 64) & (~uint64_t{0} << (p % 64));
    if (w != 0) return std::min(end, p / 64 * 64 + static_cast<size_t>(__builtin_ctzll(w)));
    p = (p / 64 + 1) * 64;
  }
  return end;
}

// Whole words in a tight loop: a 16 MiB extent is 64 words, counted and set
// on every alloc and free.
size_t CountSetPlain(const uint64_t* bits, size_t first, size_t n) {
  return CountBits(first, n, [bits](size_t i) { return bits[i]; });
}

size_t CountAndNotPlain(const uint64_t* bits, const uint64_t* clear, size_t first, size_t n) {
  return CountBits(first, n, [bits, clear](size_t i) { return bits[i] & ~clear[i]; });
}

// On x86-64 each count is built twice more with the popcnt instruction
// (without it the builtin is a libgcc call) and chosen at the first call by
// what glibc recorded of the CPU. Asking the CPU would cost a cpuid, a trap to
// the hypervisor in a VM (3 us here): gcc's target_clones ran several in
// libgcc's constructor at every program's start, and wrote a .bss page.
#if defined(__x86_64__) && defined(__has_include)
#if __has_include(<sys/platform/x86.h>)
#define RDMALLOC_POPCNT_CHOICE 1
#endif
#endif

#ifdef RDMALLOC_POPCNT_CHOICE
__attribute__((target("popcnt"))) size_t CountSetPopcnt(const uint64_t* bits, size_t first,
                                                        size_t n) {
  return CountBits(first, n, [bits](size_t i) { return bits[i]; });
}

__attribute__((target("popcnt"))) size_t CountAndNotPopcnt(const uint64_t* bits,
                                                           const uint64_t* clear, size_t first,
                                                           size_t n) {
  return CountBits(first, n, [bits, clear](size_t i) { return bits[i] & ~clear[i]; });
}
#endif

size_t CountSetFirst(const uint64_t* bits, size_t first, size_t n);
size_t CountAndNotFirst(const uint64_t* bits, const uint64_t* clear, size_t first, size_t n);

// In .data, relocated by the loader: no page of their own to fault in.
std::atomic<decltype(&CountSetPlain)> g_count_set{CountSetFirst};
std::atomic<decltype(&CountAndNotPlain)> g_count_and_not{CountAndNotFirst};

void ChooseCounts() {
#ifdef RDMALLOC_POPCNT_CHOICE
  if (CPU_FEATURE_ACTIVE(POPCNT)) {
    g_count_set.store(CountSetPopcnt, std::memory_order_relaxed);
    g_count_and_not.store(CountAndNotPopcnt, std::memory_order_relaxed);
    return;
  }
#endif
  g_count_set.store(CountSetPlain, std::memory_order_relaxed);
  g_count_and_not.store(CountAndNotPlain, std::memory_order_relaxed);
}

size_t CountSetFirst(const uint64_t* bits, size_t first, size_t n) {
  ChooseCounts();
  return g_count_set.load(std::memory_order_relaxed)(bits, first, n);
}

size_t CountAndNotFirst(const uint64_t* bits, const uint64_t* clear, size_t first, size_t n) {
  ChooseCounts();
  return g_count_and_not.load(std::memory_order_relaxed)(bits, clear, first, n);
}

}  // namespace

size_t PageMap::CountSet(const uint64_t* bits, size_t first, size_t n) const {
  return g_count_set.load(std::memory_order_relaxed)(bits, first, n);
}

size_t PageMap::CountResident(size_t first, size_t n) const {
  return g_count_and_not.load(std::memory_order_relaxed)(dirty_, untouched_, first, n);
}

size_t PageMap::NextResident(size_t p, size_t end, bool resident) const {
  uint64_t flip = resident ? 0 : ~uint64_t{0};
  return NextBit(p, end, [this, flip](size_t i) { return (dirty_[i] & ~untouched_[i]) ^ flip; });
}

bool PageMap::AnySet(const uint64_t* bits, size_t first, size_t n) const {
  if (n == 0) return false;
  size_t end = first + n, w = first / 64, last = (end - 1) / 64;
  if (w == last) return (bits[w] & Bits(first % 64, end - w * 64)) != 0;
  // Or-ed four words at a time, with no branch per word: the ranges asked
  // about are mostly clear (a free range, an extent of small blocks only).
  uint64_t any = (bits[w] & Bits(first % 64, 64)) | (bits[last] & Bits(0, end - last * 64));
  size_t i = w + 1;
  for (; i + 4 <= last; i += 4) any |= bits[i] | bits[i + 1] | bits[i + 2] | bits[i + 3];
  for (; i < last; i++) any |= bits[i];
  return any != 0;
}

void PageMap::SetRange(uint64_t* bits, size_t first, size_t n, bool value) {
  if (n == 0) return;
  size_t end = first + n, w = first / 64, last = (end - 1) / 64;
  auto apply = [&](size_t i, uint64_t mask) { bits[i] = value ? (bits[i] | mask) : (bits[i] & ~mask); };
  if (w == last) {
    apply(w, Bits(first % 64, end - w * 64));
    return;
  }
  apply(w, Bits(first % 64, 64));
  uint64_t fill = value ? ~uint64_t{0} : 0;
  for (size_t i = w + 1; i < last; i++) bits[i] = fill;
  apply(last, Bits(0, end - last * 64));
}

size_t PageMap::NextDirtyFree(size_t p, Which which, bool dirty_free) const {
  uint64_t flip = dirty_free ? 0 : ~uint64_t{0};
  uint64_t untouched_flip = which == Which::kUntouched ? 0 : ~uint64_t{0};
  return NextBit(p, npages_, [=](size_t i) {
    uint64_t kind = which == Which::kAll ? ~uint64_t{0} : untouched_[i] ^ untouched_flip;
    return (dirty_[i] & ~used_[i] & kind) ^ flip;
  });
}

size_t PageMap::NextWithUsed(size_t p, bool used) const {
  uint64_t flip = used ? 0 : ~uint64_t{0};
  return NextBit(p, npages_, [this, flip](size_t i) { return used_[i] ^ flip; });
}

size_t PageMap::FindFree(size_t n, size_t align, size_t skew, size_t* resident,
                         size_t head_pages) const {
  size_t best = npages_, best_resident = 0;
  if (n == 0 || n > npages_ - used_pages_) return npages_;
  size_t scored = head_pages != 0 ? std::min(n, head_pages) : n;
  auto consider = [&](size_t at) {
    size_t r = CountResident(at, scored);
    if (best == npages_ || r > best_resident) {
      best = at;
      best_resident = r;
    }
  };
  auto align_up = [&](size_t p) { return ((p + skew + align - 1) & ~(align - 1)) - skew; };
  // Free runs a word at a time: the alloc hook scans every region of its
  // shard this way.
  size_t p = NextWithUsed(0, false);
  while (p < npages_ && best_resident < scored) {
    size_t end = NextWithUsed(p + 1, true);  // the free run [p, end)
    size_t low = align_up(p);
    if (low + n <= end) {
      consider(low);
      size_t high = ((end - n + skew) & ~(align - 1)) - skew;
      if (high > low) consider(high);
      // Where each run of resident pages after low starts (the first 16):
      // a freed sparse block's head.
      constexpr int kMaxHeads = 16;
      auto next_head = [&](size_t q) { return NextResident(NextResident(q, end, false), end, true); };
      size_t q = next_head(low);
      for (int k = 0; head_pages != 0 && k < kMaxHeads && q < end && best_resident < scored; k++) {
        size_t at = align_up(q);
        if (at + n > end) break;
        consider(at);
        q = next_head(q);
      }
    }
    p = NextWithUsed(end, false);
  }
  if (resident != nullptr) *resident = best_resident;
  return best;
}

bool PageMap::IsFree(size_t first, size_t n) const {
  return first + n <= npages_ && !AnySet(used_, first, n);
}

size_t PageMap::Take(size_t first, size_t n, size_t* dirty) {
  size_t all_dirty = CountSet(dirty_, first, n);
  size_t untouched = CountSet(untouched_, first, n);
  SetRange(used_, first, n, true);
  SetRange(dirty_, first, n, true);
  SetRange(untouched_, first, n, false);
  used_pages_ += n;
  dirty_free_pages_ -= all_dirty - untouched;
  untouched_free_pages_ -= untouched;
  if (dirty != nullptr) *dirty = all_dirty;
  return all_dirty - untouched;
}

void PageMap::Give(size_t first, size_t n, bool purged) {
  SetRange(used_, first, n, false);
  if (purged) SetRange(dirty_, first, n, false);
  else dirty_free_pages_ += n;  // every used page is dirty
  used_pages_ -= n;
}

size_t PageMap::Purged(size_t first, size_t n) {
  size_t untouched = CountSet(untouched_, first, n);
  SetRange(dirty_, first, n, false);
  SetRange(untouched_, first, n, false);
  untouched_free_pages_ -= untouched;
  dirty_free_pages_ -= n - untouched;
  return n - untouched;
}

void PageMap::GiveUntouched(size_t first, size_t n) {
  SetRange(used_, first, n, false);
  SetRange(untouched_, first, n, true);  // and dirty, as every used page
  untouched_free_pages_ += n;
  used_pages_ -= n;
}

}  // namespace rdmalloc
