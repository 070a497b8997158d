/* rdmalloc: a malloc whose heap is registered for RDMA.
 *
 * Every byte the malloc family returns lives in a *region*: a block of memory
 * that rdmalloc mapped, registered with each protection domain (PD), and keeps
 * registered until the allocator really gives it back to the OS. Ask for keys
 * with rdmalloc_lookup(); never call ibv_reg_mr() in the message path.
 *
 * Plain C API. Include <infiniband/verbs.h> yourself if you use ibverbs types.
 */
#ifndef RDMALLOC_H
#define RDMALLOC_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

struct ibv_pd;
struct ibv_mr;

/* Return codes. 0 is success; every error is negative and distinct. */
enum {
  RDMALLOC_OK = 0,
  RDMALLOC_ENOTOURS = -1,   /* address is not rdmalloc heap (stack, static, foreign mmap, NULL, freed region) */
  RDMALLOC_ECROSS = -2,     /* [addr, addr+len) does not fit in the region that holds addr */
  RDMALLOC_EREGFAIL = -3,   /* registration failed; errno (and keys.reg_errno) tells why */
  RDMALLOC_EINVAL = -4,     /* bad arguments: NULL out, overflowing range, unknown pd, bad access flags */
  RDMALLOC_ENOTSUP = -5,    /* the backend cannot do this (e.g. dma on a backend without a data path) */
  RDMALLOC_EDMA = -6        /* a dma transfer failed; errno tells why */
};

/* Access rights for rdmalloc_add_pd (same bit values as enum ibv_access_flags). */
enum {
  RDMALLOC_ACCESS_LOCAL_WRITE = 1,
  RDMALLOC_ACCESS_REMOTE_WRITE = 2,
  RDMALLOC_ACCESS_REMOTE_READ = 4,
  RDMALLOC_ACCESS_REMOTE_ATOMIC = 8,
  RDMALLOC_ACCESS_RELAXED_ORDERING = 1 << 20
};

/* rdmalloc_lookup and rdmalloc_owns look at an address, never at the bytes
 * behind it: saying so keeps GCC from warning that a fresh malloc'd buffer
 * passed to them "may be used uninitialized". */
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 11
#define RDMALLOC_ADDRESS_ONLY(i) __attribute__((access(none, i)))
#else
#define RDMALLOC_ADDRESS_ONLY(i)
#endif

struct rdmalloc_keys {
  uint32_t lkey;            /* local key for [addr, addr+len) */
  uint32_t rkey;            /* remote key for [addr, addr+len) */
  struct ibv_mr *mr;        /* the region's MR on the verbs backend; NULL otherwise */
  void *handle;             /* backend handle: the MR (verbs) or the pinning ring (uring) */
  void *region_base;        /* the registered region that holds addr */
  size_t region_len;
  const void *addr;         /* as given to rdmalloc_lookup; dma offsets count from here */
  size_t len;
  int reg_errno;            /* with RDMALLOC_EREGFAIL: the backend's errno */
  int domain;               /* rdmalloc's index of the pd (0: default); used by rdmalloc_dma_* */
  int access;               /* RDMALLOC_ACCESS_* rights the registration grants */
};

/* Keys for [addr, addr+len) under pd (NULL: rdmalloc's default domain).
 * The range must lie inside one allocation. Registers the region on first use
 * if it is not registered yet; afterwards this takes no lock, allocates nothing
 * and makes no system call. Keys stay valid until the allocation is freed. */
RDMALLOC_ADDRESS_ONLY(1)
int rdmalloc_lookup(const void *addr, size_t len, struct ibv_pd *pd, struct rdmalloc_keys *out);

/* 1 if [addr, addr+len) lies in one live region of rdmalloc's heap, else 0.
 * Takes no lock, registers nothing, never waits: safe under another cache's
 * locks (libfabric's monitor asks it whether a range will be notified). */
RDMALLOC_ADDRESS_ONLY(1)
int rdmalloc_owns(const void *addr, size_t len);

/* Make the heap available under another PD (another device), or stop doing so.
 * On the uring backend a "pd" is an opaque non-NULL token that gets its own
 * pinning ring. Returns 0 or a negative RDMALLOC_E* code. */
int rdmalloc_add_pd(struct ibv_pd *pd, int access);
/* A lookup under pd racing with its removal returns RDMALLOC_EINVAL (unknown
 * pd), as one after it does. */
int rdmalloc_remove_pd(struct ibv_pd *pd);

/* Access classes. The plain heap (malloc, new, ...) is registered for local
 * access only (RDMALLOC_ACCESS can widen that for legacy code): a peer holding
 * an rkey of it can do nothing. Memory a peer may read, write or use atomics
 * on comes from rdmalloc_alloc with those flags, out of separate arenas whose
 * regions hold nothing else and are registered with exactly those rights
 * (plus local write). free(), realloc() and delete work on it as usual;
 * realloc keeps the class. flags 0 is malloc. Returns NULL with errno EINVAL
 * for unknown flags, ENOMEM when out of memory. */
enum {
  RDMALLOC_REMOTE_READ = 1u << 0,
  RDMALLOC_REMOTE_WRITE = 1u << 1,
  RDMALLOC_REMOTE_ATOMIC = 1u << 2
};
void *rdmalloc_alloc(size_t size, unsigned flags);
void *rdmalloc_aligned_alloc(size_t alignment, size_t size, unsigned flags);

/* Release notifications, for other registration caches (UCX, libfabric, an
 * MPI library's own). fn(addr, len, arg) runs once for every range rdmalloc
 * gives back to the OS, after rdmalloc's own registrations of it are gone and
 * before it is unmapped, so that the observer can drop its entries for
 * [addr, addr+len) before those addresses can be reused. While an observer is
 * registered, freed pages are not purged either: memory leaves the process
 * only through these notifications.
 * fn runs on rdmalloc's release thread only, outside jemalloc's hooks and
 * outside every rdmalloc lock, and no rdmalloc call ever waits for it: fn may
 * take its own cache's lock while other threads call rdmalloc_lookup holding
 * that lock, and it may call any rdmalloc_* function, malloc and free, or
 * remove itself. Up to 8 observers; returns 0, RDMALLOC_EINVAL (fn NULL,
 * table full (errno ENOSPC), the pair registered already, or removed and
 * still owed its last call (errno EBUSY)). */
typedef void (*rdmalloc_release_fn)(void *addr, size_t len, void *arg);
int rdmalloc_on_release(rdmalloc_release_fn fn, void *arg);
/* Stops notifications to (fn, arg), without waiting: a call of fn already
 * under way may still finish after this returns. Then, on the release thread,
 * fn(NULL, 0, arg) is called once: the last call, after every other; from
 * then on fn is never called for this registration, so that is where arg may
 * be freed. Returns 0, or RDMALLOC_EINVAL if the pair is not registered
 * (or, errno ENOMEM, if the note of the last call cannot be allocated). */
int rdmalloc_on_release_remove(rdmalloc_release_fn fn, void *arg);

/* "verbs", "uring" or "none". */
const char *rdmalloc_backend(void);

/* Move bytes through the registration, as a peer's NIC would: dma_write puts
 * src into the registered pages at keys->addr + off (an RDMA WRITE: needs
 * remote write), dma_read copies them out (an RDMA READ: needs remote read);
 * without the right it fails with RDMALLOC_EDMA and errno EACCES, as the NIC
 * refuses it. Proves a buffer's registration is live (tests, health checks):
 * use memory from rdmalloc_alloc with the matching RDMALLOC_REMOTE_* flags. */
int rdmalloc_dma_write(const struct rdmalloc_keys *k, size_t off, const void *src, size_t n);
int rdmalloc_dma_read(const struct rdmalloc_keys *k, size_t off, void *dst, size_t n);

#define RDMALLOC_MAX_DOMAINS 8

/* One protection domain's share of the registrations. */
struct rdmalloc_domain_stats {
  struct ibv_pd *pd;         /* NULL: the default domain (slot 0) or an unused slot */
  uint64_t open;             /* 1 if this slot holds a domain */
  uint64_t bytes_registered;
  uint64_t reg_calls;
  uint64_t dereg_calls;
  uint64_t reg_failures;
};

#define RDMALLOC_STATS_VERSION 1
struct rdmalloc_stats {
  uint32_t version;          /* RDMALLOC_STATS_VERSION */
  uint32_t size;             /* bytes filled in */
  uint64_t regions_live;
  uint64_t regions_created;
  uint64_t regions_released;
  uint64_t bytes_mapped;     /* live regions */
  uint64_t bytes_in_use;     /* handed to jemalloc */
  uint64_t bytes_registered; /* sum over domains (what the kernel accounts as pinned) */
  uint64_t bytes_pinned;     /* distinct bytes in regions registered with any domain */
  uint64_t domains;
  uint64_t reg_calls;
  uint64_t dereg_calls;
  uint64_t reg_ns;
  uint64_t dereg_ns;
  uint64_t reg_failures;
  uint64_t lookups;
  uint64_t lookup_not_ours;
  uint64_t lookup_cross;
  uint64_t lookup_reg_failed;
  uint64_t lookup_einval;
  uint64_t lookup_slow;      /* lookups that had to register first */
  uint64_t foreign_extents;  /* extents jemalloc made before rdmalloc's hooks */
  uint64_t releases_deferred;/* releases moved out of hook context */
  uint64_t cap_hits;         /* registrations refused by RDMALLOC_MAX_PINNED */
  uint64_t max_pinned;       /* the cap, bytes (UINT64_MAX: none) */
  struct rdmalloc_domain_stats domain[RDMALLOC_MAX_DOMAINS];
  uint64_t releases_notified;/* rdmalloc_on_release callbacks run */
  uint64_t observers;        /* rdmalloc_on_release observers registered */
  uint64_t releases_pending; /* regions queued for the release thread or being released by it */
  uint64_t heap_lock_waits;  /* extent requests and returns that found their shard's lock held */
  uint64_t bytes_retained;   /* freed bytes kept resident for reuse (RDMALLOC_RETAIN) */
  /* ibv_reg_mr and friends of the program, interposed (RDMALLOC_INTERPOSE): */
  uint64_t mrs_served;       /* served from rdmalloc's registrations, no kernel call */
  uint64_t mrs_forwarded;    /* passed to libibverbs */
  uint64_t mrs_live;         /* served MRs not yet deregistered */
  uint64_t mrs_forwarded_on_heap; /* forwarded MRs live on heap pages (they hold regions) */
  uint64_t releases_held_by_mrs;  /* empty regions kept past RDMALLOC_RETAIN for an MR */
};
/* Fills up to `size` bytes of *out (pass sizeof *out); out->size tells how
 * many were filled, so old callers keep working when the struct grows.
 * Never waits for the release thread: releases it has not finished yet are
 * counted in releases_pending (wait for 0 to see a settled heap). The counters
 * are read one by one, not as one snapshot: while other threads allocate,
 * related ones (bytes_in_use and bytes_mapped, say) may disagree briefly. */
int rdmalloc_stats(struct rdmalloc_stats *out, size_t size);

/* One line per region (address, size, use, registrations and keys per
 * domain), for debugging. Returns the number of regions written. */
int rdmalloc_dump_regions(FILE *out);

/* Release notifications for UCX and libfabric, built on rdmalloc_on_release;
 * each library is found at run time (dlopen), never linked. Call once, before
 * the library makes its registration caches (ucp_init, fi_domain); again is a
 * no-op. Returns 0; RDMALLOC_ENOTSUP with errno ENOENT (not installed), ENOSYS
 * (too old) or, for libfabric, EBUSY (a monitor is already imported or in
 * use); RDMALLOC_EINVAL if the observer table is full (UCX). See
 * docs/NOTIFICATIONS.md.
 * rdmalloc_notify_ucx: libucm.so.0 gets UCM_EVENT_VM_UNMAPPED as an external
 * event, raised by rdmalloc through ucm_vm_munmap(); UCX may then run with its
 * own hooks off (UCX_MEM_MALLOC_HOOKS=no UCX_MEM_MMAP_HOOK_MODE=none).
 * rdmalloc_notify_libfabric: libfabric.so.1 imports rdmalloc as the memory
 * monitor of its MR caches (fi_import); they cache only rdmalloc heap. */
int rdmalloc_notify_ucx(void);
int rdmalloc_notify_libfabric(void);

#ifdef __cplusplus
}
#endif
#endif /* RDMALLOC_H */
