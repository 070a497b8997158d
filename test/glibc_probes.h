// Probes of what programs rely on in glibc's malloc family beyond malloc and
// free: memalign, aligned_alloc, posix_memalign, valloc, pvalloc on every
// kind of alignment and size (overflows included), and the glibc-only
// mallinfo2, malloc_trim and malloc_info. //test:glibc_compat_test runs them
// three ways: in itself (its malloc is rdmalloc), in //test:glibc_probe
// without rdmalloc (glibc 2.36's malloc: the reference) and in glibc_probe
// with librdmalloc.so preloaded. Each probe is one line, "name<TAB>outcome";
// an outcome states only what a program may rely on (NULL or not, errno,
// alignment satisfied, usable size), never an address, so the three runs must
// print the same lines.
#ifndef RDMALLOC_TEST_GLIBC_PROBES_H_
#define RDMALLOC_TEST_GLIBC_PROBES_H_

#include <errno.h>
#include <malloc.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <string>
#include <utility>
#include <vector>

namespace glibc_probes {

using Probe = std::pair<std::string, std::string>;  // name, outcome

// errno before each call: a call that fails must set its own.
constexpr int kErrnoSentinel = 4242;

inline std::vector<size_t> Alignments() {
  // Not 1 TiB and the like: whether such an alignment can be had depends on
  // the machine's overcommit policy, not on the allocator.
  return {0, 1, 2, 3, 8, 16, 24, 32, 48, 64, 100, 4096, 4097, size_t{1} << 21, size_t{1} << 62,
          SIZE_MAX / 2, SIZE_MAX / 2 + 1, SIZE_MAX / 2 + 2, SIZE_MAX - 4095, SIZE_MAX};
}

inline std::vector<size_t> Sizes() {
  constexpr size_t kPtrdiffMax = static_cast<size_t>(PTRDIFF_MAX);
  return {0, 1, 16, 48, 100, 4096, size_t{1} << 20, kPtrdiffMax, kPtrdiffMax + 1, SIZE_MAX - 4096, SIZE_MAX};
}

inline std::string Num(size_t v) {
  constexpr size_t kHalf = SIZE_MAX / 2;  // PTRDIFF_MAX
  if (v == SIZE_MAX) return "SIZE_MAX";
  if (v > SIZE_MAX - (size_t{1} << 20)) return "SIZE_MAX-" + std::to_string(SIZE_MAX - v);
  if (v >= kHalf - 4096 && v <= kHalf + 4096) {
    return v >= kHalf ? "SIZE_MAX/2+" + std::to_string(v - kHalf) : "SIZE_MAX/2-" + std::to_string(kHalf - v);
  }
  return std::to_string(v);
}

inline std::string Call(const char* fn, size_t a, size_t n) {
  return std::string(fn) + "(" + Num(a) + ", " + Num(n) + ")";
}

// The smallest power of two >= a (1 for 0); 0 if there is none.
inline size_t PowerOfTwoAtLeast(size_t a) {
  size_t p = 1;
  while (p < a && p != 0) p <<= 1;
  return p;
}

// What a program sees of one allocation; frees it.
inline std::string AllocOutcome(void* p, int err, size_t alignment, size_t size) {
  if (p == nullptr) return err == kErrnoSentinel ? "NULL errno untouched" : "NULL errno=" + std::to_string(err);
  std::string s = "memory";
  s += alignment != 0 && reinterpret_cast<uintptr_t>(p) % alignment == 0 ? ", aligned" : ", MISALIGNED";
  s += malloc_usable_size(p) >= size ? ", fits" : ", TOO SMALL";
  memset(p, 0x5a, size < 4096 ? size : 4096);
  free(p);
  return s;
}

inline std::vector<Probe> AlignedAllocationProbes() {
  std::vector<Probe> out;
  for (size_t a : Alignments()) {
    for (size_t n : Sizes()) {
      // glibc rounds an alignment up to the next power of two.
      size_t want = PowerOfTwoAtLeast(a);
      errno = kErrnoSentinel;
      void* p = memalign(a, n);
      out.emplace_back(Call("memalign", a, n), AllocOutcome(p, errno, want, n));
      errno = kErrnoSentinel;
      p = aligned_alloc(a, n);
      out.emplace_back(Call("aligned_alloc", a, n), AllocOutcome(p, errno, want, n));
      errno = kErrnoSentinel;
      void* q = reinterpret_cast<void*>(0x1234);
      int r = posix_memalign(&q, a, n);
      int err = errno;
      std::string s = "return " + std::to_string(r);
      if (r != 0) {
        s += q == reinterpret_cast<void*>(0x1234) ? ", *p untouched" : ", *p CHANGED";
      } else {
        s += reinterpret_cast<uintptr_t>(q) % a == 0 ? ", aligned" : ", MISALIGNED";
        s += malloc_usable_size(q) >= n ? ", fits" : ", TOO SMALL";
        free(q);
      }
      s += err == kErrnoSentinel ? ", errno untouched" : ", errno=" + std::to_string(err);
      out.emplace_back(Call("posix_memalign", a, n), s);
    }
  }
  return out;
}

inline std::vector<Probe> PageAllocationProbes() {
  std::vector<Probe> out;
  size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  std::vector<size_t> sizes = Sizes();
  // pvalloc rounds the size up to a page: these overflow doing so.
  for (size_t n : {SIZE_MAX - 2 * page - 32, SIZE_MAX - 2 * page - 33, SIZE_MAX - page + 2}) {
    sizes.push_back(n);
  }
  for (size_t n : sizes) {
    errno = kErrnoSentinel;
    void* p = valloc(n);
    out.emplace_back("valloc(" + Num(n) + ")", AllocOutcome(p, errno, page, n));
    size_t rounded = n > SIZE_MAX - (page - 1) ? n : (n + page - 1) / page * page;
    errno = kErrnoSentinel;
    p = pvalloc(n);
    out.emplace_back("pvalloc(" + Num(n) + ")", AllocOutcome(p, errno, page, rounded));
  }
  return out;
}

inline size_t InUse(const struct mallinfo2& m) { return m.uordblks + m.hblkhd; }

// 10 MiB in 1 MiB blocks and 1 MiB of small ones: glibc counts the big ones
// in hblkhd (mmapped chunks) and the small ones in uordblks; programs add the
// two for "bytes in use".
inline std::vector<Probe> MallinfoProbes() {
  std::vector<Probe> out;
  constexpr size_t kMiB = size_t{1} << 20;
  std::vector<void*> blocks;
  blocks.reserve(10 + 2048);
  struct mallinfo2 before = mallinfo2();
  for (int i = 0; i < 10; i++) blocks.push_back(malloc(kMiB));
  for (int i = 0; i < 2048; i++) blocks.push_back(malloc(512));
  for (size_t i = 0; i < blocks.size(); i++) memset(blocks[i], 1, i < 10 ? kMiB : 512);
  struct mallinfo2 during = mallinfo2();
  for (void* b : blocks) free(b);
  struct mallinfo2 after = mallinfo2();
  size_t grew = InUse(during) - InUse(before);
  out.emplace_back("mallinfo2 uordblks+hblkhd with 11 MiB allocated",
                   grew >= 11 * kMiB && grew < 12 * kMiB ? "grew by 11 MiB" : "grew by " + std::to_string(grew));
  out.emplace_back("mallinfo2 arena+hblkhd covers uordblks+hblkhd",
                   during.arena + during.hblkhd >= InUse(during) ? "yes" : "no");
  out.emplace_back("mallinfo2 uordblks+hblkhd after freeing them",
                   InUse(after) < InUse(before) + kMiB ? "back within 1 MiB"
                                                       : "still " + std::to_string(InUse(after) - InUse(before)) + " more");
  return out;
}

// Freed memory behind a live block (so that glibc cannot give it back at
// free() by shrinking its heap): malloc_trim gives it to the OS.
inline std::vector<Probe> TrimProbes() {
  std::vector<Probe> out;
  std::vector<void*> blocks;
  blocks.reserve(20000);
  for (int i = 0; i < 20000; i++) {
    blocks.push_back(malloc(512));
    memset(blocks.back(), 1, 512);
  }
  void* fence = malloc(512);
  for (void* b : blocks) free(b);
  out.emplace_back("malloc_trim(0) after freeing 10 MB", "returns " + std::to_string(malloc_trim(0)));
  free(fence);
  return out;
}

inline std::vector<Probe> MallocInfoProbes() {
  std::vector<Probe> out;
  char* buf = nullptr;
  size_t len = 0;
  FILE* f = open_memstream(&buf, &len);
  errno = kErrnoSentinel;
  int r = malloc_info(1, f);
  int err = errno;
  fflush(f);
  out.emplace_back("malloc_info(1, f)", "returns " + std::to_string(r) + (len == 0 ? ", writes nothing" : ", WRITES") +
                                            (err == kErrnoSentinel ? ", errno untouched" : ", errno=" + std::to_string(err)));
  r = malloc_info(0, f);
  fflush(f);
  out.emplace_back("malloc_info(0, f)", "returns " + std::to_string(r) +
                                            (len > 0 && strncmp(buf, "<malloc version=\"1\"", 19) == 0
                                                 ? ", <malloc version=\"1\" ...>"
                                                 : ", other output"));
  fclose(f);
  free(buf);
  return out;
}

inline std::vector<Probe> AllProbes() {
  std::vector<Probe> out;
  for (auto* part : {AlignedAllocationProbes, PageAllocationProbes, MallinfoProbes, TrimProbes, MallocInfoProbes}) {
    for (Probe& p : part()) out.push_back(std::move(p));
  }
  return out;
}

}  // namespace glibc_probes

#endif  // RDMALLOC_TEST_GLIBC_PROBES_H_
