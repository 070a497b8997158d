#include "allocator/region_map.h"

#include <sys/mman.h>

namespace rdmalloc {

bool RegionMap::Set(uintptr_t base, size_t size, Region* r) {
  uintptr_t first = base >> kChunkShift;
  uintptr_t last = (base + size - 1) >> kChunkShift;
  if (last >= kChunks) return false;
  for (uintptr_t c = first; c <= last; c++) {
    std::atomic<Leaf*>& top = top_[c >> kLeafBits];
    Leaf* leaf = top.load(std::memory_order_acquire);
    if (leaf == nullptr) {
      if (r == nullptr) continue;
      void* mem = mmap(nullptr, sizeof(Leaf), PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      if (mem == MAP_FAILED) {
        if (c > first) Set(base, (c - first) << kChunkShift, nullptr);
        return false;
      }
      leaf = static_cast<Leaf*>(mem);  // zero pages: every slot reads nullptr
      // Another region's writer may have put a leaf there meanwhile.
      Leaf* expected = nullptr;
      if (!top.compare_exchange_strong(expected, leaf, std::memory_order_acq_rel)) {
        munmap(mem, sizeof(Leaf));
        leaf = expected;
      }
    }
    Region* was = leaf->slot[c & (kLeafSize - 1)].exchange(r, std::memory_order_acq_rel);
    std::atomic<Region*>& guess = guesses_[c & (kGuesses - 1)];
    if (r != nullptr)
      guess.store(r, std::memory_order_release);
    else if (was != nullptr)  // unless a region set since shares the entry
      guess.compare_exchange_strong(was, nullptr, std::memory_order_acq_rel);
  }
  return true;
}

}  // namespace rdmalloc
