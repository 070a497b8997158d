#include "allocator/region_map.h"

#include <sys/mman.h>

#include <algorithm>

namespace rdmalloc {

void RegionMap::ClaimHome(uintptr_t last_chunk) {
  if (home_end_.load(std::memory_order_acquire) != 0) return;
  uintptr_t end = std::min<uintptr_t>(last_chunk + 1 + kHomeChunksAbove, kChunks);
  end = std::max<uintptr_t>(end, kHomeChunks);
  uintptr_t unset = 0;
  home_end_.compare_exchange_strong(unset, end, std::memory_order_acq_rel);  // or another's
}

std::atomic<Region*>* RegionMap::Slot(uintptr_t chunk, bool install) {
  if (home_end_.load(std::memory_order_acquire) - 1 - chunk < kHomeChunks)
    return &home_[chunk & (kHomeChunks - 1)];
  std::atomic<Leaf*>& top = top_[chunk >> kLeafBits];
  Leaf* leaf = top.load(std::memory_order_acquire);
  if (leaf == nullptr) {
    if (!install) return nullptr;
    void* mem = mmap(nullptr, sizeof(Leaf), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                     -1, 0);
    if (mem == MAP_FAILED) return nullptr;
    leaf = static_cast<Leaf*>(mem);  // zero pages: every slot reads nullptr
    // Another region's writer may have put a leaf there meanwhile.
    Leaf* expected = nullptr;
    if (!top.compare_exchange_strong(expected, leaf, std::memory_order_acq_rel)) {
      munmap(mem, sizeof(Leaf));
      leaf = expected;
    }
  }
  return &leaf->slot[chunk & (kLeafSize - 1)];
}

bool RegionMap::Set(uintptr_t base, size_t size, Region* r) {
  uintptr_t first = base >> kChunkShift;
  uintptr_t last = (base + size - 1) >> kChunkShift;
  if (last >= kChunks) return false;
  if (r != nullptr) ClaimHome(last);
  for (uintptr_t c = first; c <= last; c++) {
    std::atomic<Region*>* slot = Slot(c, r != nullptr);
    if (slot != nullptr) {
      slot->store(r, std::memory_order_release);
    } else if (r != nullptr) {
      if (c > first) Set(base, (c - first) << kChunkShift, nullptr);
      return false;
    }
  }
  return true;
}

}  // namespace rdmalloc
