#include "allocator/region.h"

#include <cstddef>

namespace rdmalloc {

static_assert(offsetof(Region, reg) == 0 && sizeof(RegSlot) == 64,
              "a lookup hit reads one cache line: the default domain's slot");

void PageMap::Init(uint64_t* words, size_t npages) {
  used_ = words;
  dirty_ = words + WordsFor(npages);
  large_ = words + 2 * WordsFor(npages);
  fresh_ = words + 3 * WordsFor(npages);
  npages_ = npages;
  used_pages_ = 0;
  dirty_free_pages_ = 0;
}

namespace {

// Bits [b, e) of a word, 0 <= b < e <= 64.
inline uint64_t Bits(size_t b, size_t e) {
  uint64_t high = e == 64 ? ~uint64_t{0} : (uint64_t{1} << e) - 1;
  return high & (~uint64_t{0} << b);
}

}  // namespace

// Two builds of CountSet, picked once at load time (an ifunc): without
// -mpopcnt the builtin is a libgcc call. Not under ThreadSanitizer, whose
// runtime is not up yet when the loader runs ifunc resolvers.
#if defined(__SANITIZE_THREAD__)
#define RDMALLOC_POPCNT_CLONES
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define RDMALLOC_POPCNT_CLONES
#endif
#endif
#ifndef RDMALLOC_POPCNT_CLONES
#define RDMALLOC_POPCNT_CLONES __attribute__((target_clones("popcnt", "default")))
#endif

// Whole words in a tight loop: a 16 MiB extent is 64 words, counted and set
// on every alloc and free.
RDMALLOC_POPCNT_CLONES
size_t PageMap::CountSet(const uint64_t* bits, size_t first, size_t n) const {
  if (n == 0) return 0;
  size_t end = first + n, w = first / 64, last = (end - 1) / 64;
  if (w == last) return static_cast<size_t>(__builtin_popcountll(bits[w] & Bits(first % 64, end - w * 64)));
  size_t count = static_cast<size_t>(__builtin_popcountll(bits[w] & Bits(first % 64, 64)));
  for (size_t i = w + 1; i < last; i++) count += static_cast<size_t>(__builtin_popcountll(bits[i]));
  return count + static_cast<size_t>(__builtin_popcountll(bits[last] & Bits(0, end - last * 64)));
}

bool PageMap::AnySet(const uint64_t* bits, size_t first, size_t n) const {
  if (n == 0) return false;
  size_t end = first + n, w = first / 64, last = (end - 1) / 64;
  if (w == last) return (bits[w] & Bits(first % 64, end - w * 64)) != 0;
  if (bits[w] & Bits(first % 64, 64)) return true;
  for (size_t i = w + 1; i < last; i++)
    if (bits[i] != 0) return true;
  return (bits[last] & Bits(0, end - last * 64)) != 0;
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

size_t PageMap::NextWithUsed(size_t p, bool used) const {
  while (p < npages_) {
    uint64_t w = used ? used_[p / 64] : ~used_[p / 64];
    w &= ~uint64_t{0} << (p % 64);
    if (w != 0) {
      size_t q = p / 64 * 64 + static_cast<size_t>(__builtin_ctzll(w));
      return q < npages_ ? q : npages_;
    }
    p = (p / 64 + 1) * 64;
  }
  return npages_;
}

size_t PageMap::FindFree(size_t n, size_t align, size_t skew, size_t* resident) const {
  size_t best = npages_, best_resident = 0;
  if (n == 0 || n > npages_ - used_pages_) return npages_;
  auto consider = [&](size_t at) {
    size_t r = CountSet(dirty_, at, n);
    if (best == npages_ || r > best_resident) {
      best = at;
      best_resident = r;
    }
  };
  // Free runs a word at a time: the alloc hook scans every region of its
  // shard this way.
  size_t p = NextWithUsed(0, false);
  while (p < npages_ && best_resident < n) {
    size_t end = NextWithUsed(p + 1, true);  // the free run [p, end)
    size_t low = ((p + skew + align - 1) & ~(align - 1)) - skew;
    if (low + n <= end) {
      consider(low);
      size_t high = ((end - n + skew) & ~(align - 1)) - skew;
      if (high > low) consider(high);
    }
    p = NextWithUsed(end, false);
  }
  if (resident != nullptr) *resident = best_resident;
  return best;
}

bool PageMap::IsFree(size_t first, size_t n) const {
  return first + n <= npages_ && !AnySet(used_, first, n);
}

size_t PageMap::Take(size_t first, size_t n) {
  size_t dirty = CountSet(dirty_, first, n);
  SetRange(used_, first, n, true);
  SetRange(dirty_, first, n, true);
  used_pages_ += n;
  dirty_free_pages_ -= dirty;
  return dirty;
}

void PageMap::Give(size_t first, size_t n, bool purged) {
  SetRange(used_, first, n, false);
  if (purged) SetRange(dirty_, first, n, false);
  else dirty_free_pages_ += n;  // every used page is dirty
  used_pages_ -= n;
}

}  // namespace rdmalloc
