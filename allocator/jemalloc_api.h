// jemalloc's entry points as linked into rdmalloc, renamed rdmj_* when its
// archive is imported (third_party/import_jemalloc.sh). malloc, free, new,
// delete and a few more keep their public names too: the program calls
// jemalloc's own fast paths (third_party/jemalloc_entry_points.txt). The rest
// (realloc, mallctl, ...) belong to rdmalloc's wrappers.
#ifndef RDMALLOC_ALLOCATOR_JEMALLOC_API_H_
#define RDMALLOC_ALLOCATOR_JEMALLOC_API_H_

#include <jemalloc/jemalloc.h>
#include <pthread.h>

#include <cstddef>

// jemalloc 5.3's arena_config_t (include/jemalloc/internal/arena_types.h):
// what an arena is made with. experimental.arenas_create_ext takes one.
struct ArenaConfig {
  extent_hooks_t* extent_hooks;
  bool metadata_use_hooks;  // the arena's own metadata through its hooks too
};

// jemalloc 5.3's malloc_mutex_t (include/jemalloc/internal/mutex.h, as
// Debian builds it: no debug, pthread mutexes): 64 bytes of profiling data,
// then the mutex. Checked by //test:fork_protocol_test against the lock
// jemalloc really takes.
struct JemallocMutex {
  unsigned char prof_data[64];
  pthread_mutex_t lock;
};

// The head of jemalloc 5.3's global extent map (emap_t, whose first member
// is an rtree_t): the lock jemalloc takes to add a node to the map
// (rtree.c's init_lock). jemalloc_prefork does not take it.
struct JemallocExtentMap {
  void* base;
  JemallocMutex init_lock;
};

extern "C" {
extern JemallocExtentMap je_arena_emap_global;
// What jemalloc's own fork-child handler does to each of its mutexes.
void je_malloc_mutex_postfork_child(void* tsdn, JemallocMutex* mutex);

// jemalloc's own hooks (mmap and madvise), for memory that is not rdmalloc's.
extern const extent_hooks_t je_ehooks_default_extent_hooks;
// What those hooks map memory with when they do not use the dss (sbrk).
void* je_extent_alloc_mmap(void* new_addr, size_t size, size_t alignment, bool* zero,
                           bool* commit);
// What every arena is made with (jemalloc's arena_config_default, as its
// users see it; defined by rdmalloc, see third_party/import_jemalloc.sh).
extern const ArenaConfig rdmj_arena_config;
// jemalloc's base allocator, for arena 0's hooks (rdmj_base_boot).
bool je_base_boot(void* tsdn);
void* je_b0get();
extent_hooks_t* je_base_extent_hooks_set(void* base, extent_hooks_t* hooks);

// From third_party/jemalloc_rdmalloc.patch: whether this thread runs inside
// jemalloc (an extent hook), and every thread recomputes its fast paths
// before its next allocation or free: after the start-up state or
// g_classes_in_use changes (a thread is slow while rdmalloc is not ready, and
// has no free fast path once classes exist); API context.
bool rdmj_in_jemalloc();
void rdmj_recompute_fast_paths();
// Whether this thread's allocations take jemalloc's fast paths (tests).
bool rdmj_thread_fast();

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
