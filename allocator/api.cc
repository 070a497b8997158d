// The public C API (allocator/rdmalloc.h).
#include <cstdio>

#include "allocator/heap.h"
#include "allocator/init.h"
#include "allocator/rdmalloc.h"

#define RDMALLOC_EXPORT extern "C" __attribute__((visibility("default")))

using rdmalloc::EnsureInitialised;
using rdmalloc::TheHeap;

namespace {
// Like rdmalloc_lookup it reads the address, never the bytes: without the
// same attribute GCC warns that rdmalloc_lookup passes on "uninitialized" addr.
RDMALLOC_ADDRESS_ONLY(1)
__attribute__((noinline)) int LookupFirstOnThread(const void* addr, size_t len, ibv_pd* pd,
                                                  rdmalloc_keys* out) {
  EnsureInitialised();
  return TheHeap().Lookup(addr, len, pd, out);
}
}  // namespace

// Only tail calls leave the hit path, which then needs no frame. A thread
// gets its lookup stripe (rdmalloc::t_stripe) only here, once rdmalloc has
// started, and a fork child's thread loses it: the hit path then needs no
// start-up check of its own.
RDMALLOC_EXPORT int rdmalloc_lookup(const void* addr, size_t len, struct ibv_pd* pd,
                                    struct rdmalloc_keys* out) {
  if (__builtin_expect(rdmalloc::t_stripe == nullptr, 0))
    return LookupFirstOnThread(addr, len, pd, out);
  return TheHeap().Lookup(addr, len, pd, out);
}

RDMALLOC_EXPORT int rdmalloc_owns(const void* addr, size_t len) {
  EnsureInitialised();
  return TheHeap().RegionOf(addr, len) != nullptr ? 1 : 0;
}

RDMALLOC_EXPORT int rdmalloc_add_pd(struct ibv_pd* pd, int access) {
  EnsureInitialised();
  return TheHeap().AddDomain(pd, access);
}

RDMALLOC_EXPORT int rdmalloc_remove_pd(struct ibv_pd* pd) {
  EnsureInitialised();
  return TheHeap().RemoveDomain(pd);
}

RDMALLOC_EXPORT const char* rdmalloc_backend(void) {
  EnsureInitialised();
  return TheHeap().BackendName();
}

RDMALLOC_EXPORT int rdmalloc_dma_write(const struct rdmalloc_keys* k, size_t off, const void* src,
                                       size_t n) {
  EnsureInitialised();
  return TheHeap().Dma(k, off, const_cast<void*>(src), n, /*to_memory=*/true);
}

RDMALLOC_EXPORT int rdmalloc_dma_read(const struct rdmalloc_keys* k, size_t off, void* dst,
                                      size_t n) {
  EnsureInitialised();
  return TheHeap().Dma(k, off, dst, n, /*to_memory=*/false);
}

RDMALLOC_EXPORT int rdmalloc_stats(struct rdmalloc_stats* out, size_t size) {
  EnsureInitialised();
  return TheHeap().Stats(out, size);
}

RDMALLOC_EXPORT int rdmalloc_dump_regions(FILE* out) {
  EnsureInitialised();
  return TheHeap().DumpRegions(out);
}

RDMALLOC_EXPORT int rdmalloc_on_release(rdmalloc_release_fn fn, void* arg) {
  EnsureInitialised();
  return TheHeap().AddObserver(fn, arg);
}

RDMALLOC_EXPORT int rdmalloc_on_release_remove(rdmalloc_release_fn fn, void* arg) {
  EnsureInitialised();
  return TheHeap().RemoveObserver(fn, arg);
}
