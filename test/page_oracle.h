// The page-identity oracle: does the NIC (through the registration) see the
// very bytes the CPU sees? Both directions, on any live buffer.
#ifndef RDMALLOC_TEST_PAGE_ORACLE_H_
#define RDMALLOC_TEST_PAGE_ORACLE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "allocator/rdmalloc.h"
#include "test/test_util.h"

namespace rdmalloc_test {

struct OracleResult {
  bool ok = false;
  std::string what;  // why not, for the failure message
};

// NIC -> CPU: a pattern DMA-written through the keys must be what the CPU
// reads. CPU -> NIC: a pattern the CPU writes must be what a DMA read returns.
// Checks [off, off+n) of the buffer [p, p+len).
inline OracleResult CheckPageIdentity(void* p, size_t len, size_t off, size_t n, uint64_t seed) {
  OracleResult r;
  rdmalloc_keys k;
  int rc = rdmalloc_lookup(p, len, nullptr, &k);
  if (rc != RDMALLOC_OK) {
    r.what = "lookup failed: " + std::to_string(rc);
    return r;
  }
  std::vector<uint8_t> buf(n);
  FillPattern(buf.data(), n, seed);
  rc = rdmalloc_dma_write(&k, off, buf.data(), n);
  if (rc != RDMALLOC_OK) {
    r.what = "dma_write failed: " + std::to_string(rc);
    return r;
  }
  if (!HasPattern(static_cast<uint8_t*>(p) + off, n, seed)) {
    r.what = "NIC->CPU mismatch";
    return r;
  }
  FillPattern(static_cast<uint8_t*>(p) + off, n, seed + 1);
  std::fill(buf.begin(), buf.end(), 0);
  rc = rdmalloc_dma_read(&k, off, buf.data(), n);
  if (rc != RDMALLOC_OK) {
    r.what = "dma_read failed: " + std::to_string(rc);
    return r;
  }
  if (!HasPattern(buf.data(), n, seed + 1)) {
    r.what = "CPU->NIC mismatch";
    return r;
  }
  r.ok = true;
  return r;
}

}  // namespace rdmalloc_test

#endif  // RDMALLOC_TEST_PAGE_ORACLE_H_
