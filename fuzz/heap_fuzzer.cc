// Fuzz target: sequences of malloc / calloc / aligned_alloc / rdmalloc_alloc /
// realloc / free / rdmalloc_lookup / dma / decay decoded from the input,
// against the whole allocator (this binary's malloc is rdmalloc; the backend
// is uring, see BUILD).
//
// Checked after every step, only what must hold whatever jemalloc decides:
// every live buffer keeps its bytes (also across decay and realloc) and
// resolves through rdmalloc_lookup with keys covering it and the rights of its
// access class; peers' reads through the keys see the same bytes; lookups of
// stack memory or past a region fail; stats stay consistent (in use <=
// mapped, pinned <= mapped) and agree with rdmalloc_dump_regions: live
// regions, mapped bytes and registered bytes, so a released region keeps no
// registration. Freed memory may be reused at once, so nothing is asserted
// about lookups of freed addresses.
#include <jemalloc/jemalloc.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "allocator/rdmalloc.h"

namespace {

constexpr int kSlots = 24;
constexpr size_t kMaxLive = size_t{32} << 20;
constexpr int kRemote = RDMALLOC_ACCESS_REMOTE_READ | RDMALLOC_ACCESS_REMOTE_WRITE |
                        RDMALLOC_ACCESS_REMOTE_ATOMIC;

struct Buffer {
  uint8_t* p = nullptr;
  size_t size = 0;
  unsigned flags = 0;  // RDMALLOC_REMOTE_* of rdmalloc_alloc; 0 for the plain heap
  uint64_t seed = 0;
};

Buffer g_slots[kSlots];
size_t g_live = 0;
uint64_t g_next_seed = 1;

class Input {
 public:
  Input(const uint8_t* data, size_t size) : data_(data), size_(size) {}
  bool empty() const { return pos_ >= size_; }
  uint8_t Byte() { return pos_ < size_ ? data_[pos_++] : 0; }
  uint32_t U16() { return Byte() | uint32_t{Byte()} << 8; }

 private:
  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
};

[[noreturn]] void Fail(const char* what, const void* p, size_t n) {
  fprintf(stderr, "heap_fuzzer: %s (%p, %zu)\n", what, p, n);
  abort();
}

void Check(bool ok, const char* what, const void* p = nullptr, size_t n = 0) {
  if (!ok) Fail(what, p, n);
}

uint8_t PatternByte(uint64_t seed, size_t i) {
  uint64_t x = (seed + i) * 0x9E3779B97F4A7C15ull;
  return static_cast<uint8_t>(x >> 56);
}

// Whole buffers up to 4 KiB; beyond, the first and last 256 bytes and one
// byte in every page (every byte would make large buffers too slow to fuzz).
template <typename F>
void ForSampled(size_t size, F f) {
  if (size <= 4096) {
    for (size_t i = 0; i < size; i++) f(i);
    return;
  }
  for (size_t i = 0; i < 256; i++) f(i);
  for (size_t at = 4096 + 7; at < size - 256; at += 4096) f(at);
  for (size_t i = size - 256; i < size; i++) f(i);
}

void Fill(Buffer& b) {
  ForSampled(b.size, [&](size_t i) { b.p[i] = PatternByte(b.seed, i); });
}

void CheckIntact(const Buffer& b) {
  ForSampled(b.size, [&](size_t i) {
    if (b.p[i] != PatternByte(b.seed, i)) Fail("buffer bytes changed", b.p + i, b.size);
  });
}

// Mostly small; some large; a few larger than a region (dedicated regions,
// RDMALLOC_REGION_SIZE=2M). Every fresh region is pinned page by page, so
// large sizes cost most of the time: kept rare.
size_t PickSize(Input& in) {
  uint32_t r = in.U16();
  switch (in.Byte() % 16) {
    case 0: return r % 64 + 1;
    case 1: case 2: case 3: case 4: case 5: case 6: case 7: return r % 4096 + 1;
    case 8: case 9: case 10: case 11: case 12: return (r % 512 + 1) * 512;  // up to 256 KiB
    case 13: case 14: return (r % 16 + 1) * 65536;                          // up to 1 MiB
    default: return (size_t{2} << 20) + (r % 16) * 65536;
  }
}

void CheckLookup(const Buffer& b, size_t off, size_t len) {
  rdmalloc_keys k;
  int rc = rdmalloc_lookup(b.p + off, len, nullptr, &k);
  if (rc != RDMALLOC_OK) {
    fprintf(stderr, "heap_fuzzer: lookup returned %d (reg_errno %d)\n", rc, k.reg_errno);
    Fail("live buffer did not resolve", b.p + off, len);
  }
  auto base = reinterpret_cast<uintptr_t>(k.region_base);
  auto a = reinterpret_cast<uintptr_t>(b.p);
  Check(base <= a && a - base + b.size <= k.region_len, "keys' region does not cover the buffer",
        b.p, b.size);
  Check(k.addr == b.p + off && k.len == len, "keys for another range", b.p + off, len);
  // The plain heap grants no remote rights; a class exactly its own.
  int want = (b.flags & RDMALLOC_REMOTE_READ ? RDMALLOC_ACCESS_REMOTE_READ : 0) |
             (b.flags & RDMALLOC_REMOTE_WRITE ? RDMALLOC_ACCESS_REMOTE_WRITE : 0) |
             (b.flags & RDMALLOC_REMOTE_ATOMIC ? RDMALLOC_ACCESS_REMOTE_ATOMIC : 0);
  Check((k.access & kRemote) == want, "keys grant other remote rights", b.p, b.flags);
  if (b.flags & RDMALLOC_REMOTE_READ) {
    // What a peer reads through the key is what the CPU wrote.
    uint8_t seen[256];
    size_t n = len < sizeof seen ? len : sizeof seen;
    Check(rdmalloc_dma_read(&k, 0, seen, n) == RDMALLOC_OK, "dma read failed", b.p + off, n);
    Check(memcmp(seen, b.p + off, n) == 0, "dma read other bytes than the CPU sees", b.p + off, n);
  }
}

void CheckAll() {
  for (const Buffer& b : g_slots) {
    if (b.p == nullptr) continue;
    CheckIntact(b);
    CheckLookup(b, 0, b.size);
  }
}

// Stats against themselves and against the per-region dump.
void CheckStats() {
  struct rdmalloc_stats s;
  Check(rdmalloc_stats(&s, sizeof s) == RDMALLOC_OK, "stats failed");
  Check(s.bytes_in_use <= s.bytes_mapped, "more bytes in use than mapped", nullptr, s.bytes_in_use);
  Check(s.bytes_pinned <= s.bytes_mapped, "more bytes pinned than mapped", nullptr, s.bytes_pinned);
  Check(s.regions_live == s.regions_created - s.regions_released, "region counts disagree");
  Check(s.bytes_in_use >= g_live, "live buffers exceed bytes in use", nullptr, g_live);
  char* text = nullptr;
  size_t text_len = 0;
  FILE* f = open_memstream(&text, &text_len);
  Check(f != nullptr, "open_memstream failed");
  int regions = rdmalloc_dump_regions(f);
  fclose(f);
  uint64_t mapped = 0, registered = 0;
  int lines = 0;
  for (char* line = text; line != nullptr && *line != '\0';) {
    char* end = strchr(line, '\n');
    if (end != nullptr) *end = '\0';
    void *lo = nullptr, *hi = nullptr;
    if (sscanf(line, "region %p-%p", &lo, &hi) == 2) {
      uint64_t bytes = reinterpret_cast<uintptr_t>(hi) - reinterpret_cast<uintptr_t>(lo);
      lines++;
      mapped += bytes;
      if (strstr(line, "domain 0: lkey") != nullptr) registered += bytes;
    }
    line = end != nullptr ? end + 1 : nullptr;
  }
  free(text);
  // Nothing else runs in this process (the uring backend releases regions at
  // once), so the counters and the dump describe the same heap.
  Check(regions == lines && static_cast<uint64_t>(lines) == s.regions_live,
        "dump and stats count other regions", nullptr, lines);
  Check(mapped == s.bytes_mapped, "dump and stats map other bytes", nullptr, mapped);
  Check(registered == s.bytes_registered && registered == s.domain[0].bytes_registered,
        "registered bytes disagree with the registered regions", nullptr, registered);
}

void ForceDecay() {
  mallctl("thread.tcache.flush", nullptr, nullptr, nullptr, 0);
  mallctl("arena.4096.purge", nullptr, nullptr, nullptr, 0);  // all arenas
}

void Release(Buffer& b) {
  CheckIntact(b);
  free(b.p);
  g_live -= b.size;
  b = Buffer();
}

void Allocate(Buffer& b, Input& in) {
  size_t size = PickSize(in);
  if (g_live + size > kMaxLive) return;
  uint8_t kind = in.Byte();
  unsigned flags = 0;
  void* p = nullptr;
  switch (kind % 5) {
    case 0: p = malloc(size); break;
    case 1:
      p = calloc(1, size);
      Check(p != nullptr, "calloc failed", nullptr, size);
      ForSampled(size, [&](size_t i) { Check(static_cast<uint8_t*>(p)[i] == 0, "calloc not zero", p, i); });
      break;
    case 2: {
      size_t align = size_t{1} << (3 + in.Byte() % 14);  // 8 .. 64 KiB
      p = aligned_alloc(align, (size + align - 1) & ~(align - 1));
      size = (size + align - 1) & ~(align - 1);
      Check(p != nullptr && reinterpret_cast<uintptr_t>(p) % align == 0, "misaligned", p, align);
      break;
    }
    default:
      flags = 1 + in.Byte() % 7;  // RDMALLOC_REMOTE_READ | _WRITE | _ATOMIC combinations
      p = rdmalloc_alloc(size, flags);
      break;
  }
  Check(p != nullptr, "allocation failed", nullptr, size);
  b.p = static_cast<uint8_t*>(p);
  b.size = size;
  b.flags = flags;
  b.seed = g_next_seed++;
  g_live += size;
  Fill(b);
  CheckLookup(b, 0, size);
}

void Reallocate(Buffer& b, Input& in) {
  size_t size = PickSize(in);
  if (g_live - b.size + size > kMaxLive) return;
  CheckIntact(b);
  void* p = realloc(b.p, size);
  Check(p != nullptr, "realloc failed", b.p, size);
  // The common prefix came along (the bytes Fill wrote below the new size).
  const uint8_t* q = static_cast<const uint8_t*>(p);
  ForSampled(b.size, [&](size_t i) {
    if (i < size && q[i] != PatternByte(b.seed, i)) Fail("realloc lost bytes", q + i, size);
  });
  b.p = static_cast<uint8_t*>(p);
  g_live = g_live - b.size + size;
  b.size = size;
  b.seed = g_next_seed++;
  Fill(b);
  CheckLookup(b, 0, size);  // realloc keeps the access class
}

// Lookups that must fail.
void CheckMisses(const Buffer* b) {
  rdmalloc_keys k;
  int on_stack[4];
  Check(rdmalloc_lookup(on_stack, sizeof on_stack, nullptr, &k) == RDMALLOC_ENOTOURS,
        "stack memory resolved");
  if (b == nullptr) return;
  Check(rdmalloc_lookup(b->p, SIZE_MAX, nullptr, &k) == RDMALLOC_EINVAL, "overflowing range");
  Check(rdmalloc_lookup(b->p, 1, nullptr, &k) == RDMALLOC_OK, "live buffer did not resolve");
  size_t to_end = reinterpret_cast<uintptr_t>(k.region_base) + k.region_len -
                  reinterpret_cast<uintptr_t>(b->p);
  Check(rdmalloc_lookup(b->p, to_end + 1, nullptr, &k) == RDMALLOC_ECROSS,
        "range past its region resolved", b->p, to_end + 1);
  Check(rdmalloc_lookup(b->p, 1, nullptr, nullptr) == RDMALLOC_EINVAL, "no output accepted");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Input in(data, size);
  int steps = 0;
  while (!in.empty() && steps++ < 256) {
    uint8_t op = in.Byte();
    Buffer& b = g_slots[in.Byte() % kSlots];
    switch (op % 16) {
      case 0: case 1: case 2: case 3: case 4: case 5:
        if (b.p != nullptr) Release(b);
        Allocate(b, in);
        break;
      case 6: case 7: case 8:
        if (b.p != nullptr) Release(b);
        break;
      case 9: case 10:
        if (b.p != nullptr) Reallocate(b, in);
        break;
      case 11: case 12: case 13:
        if (b.p != nullptr) {
          size_t off = in.U16() % b.size;
          CheckLookup(b, off, 1 + in.U16() % (b.size - off));
        }
        CheckMisses(b.p != nullptr ? &b : nullptr);
        break;
      case 14:
        // Decay gives cached extents back to the heap, which releases empty
        // regions (deregistering them): live buffers must not notice.
        // Rarer than the rest: every released region costs a fresh
        // registration later, which pins (faults in) all of its pages.
        ForceDecay();
        CheckAll();
        CheckStats();
        break;
      default:
        CheckStats();
        break;
    }
  }
  CheckAll();
  for (Buffer& s : g_slots)
    if (s.p != nullptr) Release(s);
  CheckStats();
  return 0;
}
