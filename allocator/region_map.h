// Address -> region, lock-free for readers.
//
// Regions start on a 2 MiB boundary and span whole 2 MiB chunks, so a chunk
// belongs to at most one region. A two-level radix table indexed by chunk
// number answers with two dependent loads; leaves are mmap'd on demand and
// never freed (64 KiB each, one per 16 GiB of address space in use).
//
// The lookup hit path asks a direct-mapped table first, one load: the region
// last set over a chunk with the same low 16 bits of chunk number. Chunks
// 128 GiB apart share an entry, and an entry may name a region since moved or
// released (descriptors are never freed), so the reader checks the region's
// range, under its seq, and asks the radix table when it does not hold.
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

  // A guess for addr: a region, nullptr, or some region not holding addr.
  Region* Guess(uintptr_t addr) const {
    return guesses_[(addr >> kChunkShift) & (kGuesses - 1)].load(std::memory_order_acquire);
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

  // 512 KiB, untouched until regions are set: one 4 KiB page per GiB of heap.
  static constexpr size_t kGuesses = size_t{1} << 16;

  std::atomic<Leaf*> top_[kTopSize] = {};
  std::atomic<Region*> guesses_[kGuesses] = {};
};

}  // namespace rdmalloc

#endif  // RDMALLOC_ALLOCATOR_REGION_MAP_H_
