// The address of a block, for checks that look at its pages after it is
// freed (residency, ownership, an MR still on them). Nothing of rdmalloc's,
// so a program that never includes rdmalloc.h can use it too.
#ifndef RDMALLOC_TEST_ADDRESS_ONLY_H_
#define RDMALLOC_TEST_ADDRESS_ONLY_H_

#include <cstdint>

namespace rdmalloc_test {

// Opaque to the compiler, which would rightly call any use of the freed
// block's own pointer a use after free, and may assume none happens. Take
// it before the free.
inline char* AddressOnly(const void* block) {
  uintptr_t a = reinterpret_cast<uintptr_t>(block);
  asm volatile("" : "+r"(a));
  return reinterpret_cast<char*>(a);
}

}  // namespace rdmalloc_test

#endif  // RDMALLOC_TEST_ADDRESS_ONLY_H_
