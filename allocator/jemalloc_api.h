// jemalloc's entry points as linked into rdmalloc. The public names (malloc,
// mallctl, ...) belong to rdmalloc's wrappers; jemalloc's own definitions are
// renamed to rdmj_* when its archive is imported (see third_party/BUILD.system).
#ifndef RDMALLOC_ALLOCATOR_JEMALLOC_API_H_
#define RDMALLOC_ALLOCATOR_JEMALLOC_API_H_

#include <cstddef>

extern "C" {
void* rdmj_malloc(size_t size);
void* rdmj_calloc(size_t n, size_t size);
void* rdmj_realloc(void* p, size_t size);
int rdmj_posix_memalign(void** p, size_t alignment, size_t size);
void* rdmj_aligned_alloc(size_t alignment, size_t size);
void* rdmj_memalign(size_t alignment, size_t size);
void* rdmj_valloc(size_t size);
void* rdmj_mallocx(size_t size, int flags);
void* rdmj_rallocx(void* p, size_t size, int flags);
void rdmj_free(void* p);
void rdmj_dallocx(void* p, int flags);
void rdmj_sdallocx(void* p, size_t size, int flags);
int rdmj_mallctl(const char* name, void* oldp, size_t* oldlenp, void* newp, size_t newlen);
int rdmj_mallctlnametomib(const char* name, size_t* mibp, size_t* miblenp);
int rdmj_mallctlbymib(const size_t* mib, size_t miblen, void* oldp, size_t* oldlenp, void* newp,
                      size_t newlen);
}

#endif  // RDMALLOC_ALLOCATOR_JEMALLOC_API_H_
