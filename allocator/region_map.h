// Address -> region, lock-free for readers.
//
// Regions start on a 2 MiB boundary and span whole 2 MiB chunks, so a chunk
// belongs to at most one region. A two-level radix table indexed by chunk
// number answers with two dependent loads; leaves are mmap'd on demand and
// never freed (64 KiB each, one per 16 GiB of address space in use).
#ifndef RDMALLOC_ALLOCATOR_REGION_MAP_H_
#define RDMALLOC_ALLOCATOR_REGION_MAP_H_

#include <atomic>
#include <cstddef>
#include <cstdint>

namespace rdmalloc {

constexpr unsigned kChunkShift = 21;  // 2 MiB
constexpr size_t kChunkSize = size_t{1} << kChunkShift;

struct Region;

class RegionMap {
 public:
  constexpr RegionMap() = default;

  // Lock-free; never allocates. nullptr if no region covers addr's chunk.
  Region* Find(uintptr_t addr) const {
    uintptr_t chunk = addr >> kChunkShift;
    if (chunk >= kChunks) return nullptr;
    Leaf* leaf = top_[chunk >> kLeafBits].load(std::memory_order_acquire);
    if (leaf == nullptr) return nullptr;
    return leaf->slot[chunk & (kLeafSize - 1)].load(std::memory_order_acquire);
  }

  // Writers of different regions may run at once (each chunk belongs to one
  // region; leaves are installed with compare-and-swap). Returns false if a
  // leaf could not be mapped (the range is then left unset).
  bool Set(uintptr_t base, size_t size, Region* r);
  void Clear(uintptr_t base, size_t size) { Set(base, size, nullptr); }

 private:
  static constexpr unsigned kAddressBits = 47;  // x86-64/aarch64 user space
  static constexpr unsigned kChunkBits = kAddressBits - kChunkShift;
  static constexpr unsigned kLeafBits = kChunkBits / 2;
  static constexpr size_t kLeafSize = size_t{1} << kLeafBits;
  static constexpr size_t kChunks = size_t{1} << kChunkBits;
  static constexpr size_t kTopSize = kChunks >> kLeafBits;

  struct Leaf {
    std::atomic<Region*> slot[kLeafSize];
  };

  std::atomic<Leaf*> top_[kTopSize] = {};
};

}  // namespace rdmalloc

#endif  // RDMALLOC_ALLOCATOR_REGION_MAP_H_
