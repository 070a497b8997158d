// Address -> region, lock-free for readers.
//
// Regions start on a 2 MiB boundary and span whole 2 MiB chunks, so a chunk
// belongs to at most one region. The first region set fixes the *home
// window*: 2^16 consecutive chunks (128 GiB) around it. mmap places a
// process's mappings downward from one point, so the window ends 256 MiB
// above the first region and reaches 127.75 GiB below it. The window never
// moves. Its chunks have a slot each in the home table, indexed by the low 16
// bits of the chunk number, which 2^16 consecutive chunks never share: a
// lookup there is one load whose address depends on the address alone (the
// window check runs beside it, or is left to the caller: Guess). Chunks
// outside the window live in a two-level radix table (two dependent loads)
// whose leaves are mmap'd on demand and never freed (64 KiB each, one per
// 16 GiB of address space in use).
//
// A small program writes two pages of the map (the window's end, one home
// slot); with the radix table alone it wrote three and mapped a leaf.
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
  static constexpr size_t kHomeChunks = size_t{1} << 16;
  static constexpr size_t kHomeChunksAbove = 128;  // 256 MiB above the first region

  constexpr RegionMap() = default;

  // Lock-free; never allocates. nullptr if no region covers addr's chunk.
  Region* Find(uintptr_t addr) const {
    uintptr_t chunk = addr >> kChunkShift;
    Region* home = home_[chunk & (kHomeChunks - 1)].load(std::memory_order_acquire);
    // Counted down from the window's end: its zero value, no window yet,
    // makes every distance too large.
    if (__builtin_expect(home_end_.load(std::memory_order_relaxed) - 1 - chunk < kHomeChunks, 1))
      return home;
    return FindOutside(chunk);
  }

  // One load, for the lookup hit path: Find's answer inside the window;
  // outside it, nullptr or the region of the window's chunk with the same low
  // bits. The caller checks the region's range and asks Find when it fails.
  // (Find's window check alone cost a random lookup 0.8 ns, 4.5 -> 5.3.)
  // The slot's byte offset is masked from addr directly: indexing by chunk
  // cost one more instruction (an add to the table's offset in the heap).
  Region* Guess(uintptr_t addr) const {
    constexpr unsigned kSlotShift = kChunkShift - 3;  // sizeof(home_[0]) == 8
    static_assert(sizeof(home_[0]) == size_t{1} << (kChunkShift - kSlotShift), "slot size");
    size_t offset = (addr >> kSlotShift) & ((kHomeChunks - 1) << (kChunkShift - kSlotShift));
    return reinterpret_cast<const std::atomic<Region*>*>(reinterpret_cast<const char*>(home_) +
                                                         offset)
        ->load(std::memory_order_acquire);
  }

  // Writers of different regions may run at once (each chunk belongs to one
  // region; the window is claimed and leaves are installed with
  // compare-and-swap). Returns false if a leaf could not be mapped (the range
  // is then left unset).
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

  Region* FindOutside(uintptr_t chunk) const {
    if (chunk >= kChunks) return nullptr;
    Leaf* leaf = top_[chunk >> kLeafBits].load(std::memory_order_acquire);
    if (leaf == nullptr) return nullptr;
    return leaf->slot[chunk & (kLeafSize - 1)].load(std::memory_order_acquire);
  }
  void ClaimHome(uintptr_t last_chunk);
  // nullptr if chunk's leaf does not exist and install is false or no memory
  // could be mapped for it.
  std::atomic<Region*>* Slot(uintptr_t chunk, bool install);

  // 512 KiB, untouched until regions are set: one 4 KiB page per GiB of heap.
  std::atomic<Region*> home_[kHomeChunks] = {};
  std::atomic<Leaf*> top_[kTopSize] = {};
  // Last: the state a program's first malloc writes follows it (RegionStore).
  std::atomic<uintptr_t> home_end_{0};
};

}  // namespace rdmalloc

#endif  // RDMALLOC_ALLOCATOR_REGION_MAP_H_
