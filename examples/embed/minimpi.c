// minimpi: see minimpi.h. Built with librdmalloc.a inside (see BUILD).
#define _GNU_SOURCE
#include "examples/embed/minimpi.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "allocator/rdmalloc.h"

static pthread_mutex_t wire_lock = PTHREAD_MUTEX_INITIALIZER;
static void *wire;        // the message in flight ("on the wire")
static size_t wire_len;
static int wire_tag;
static int wire_full;

// minimpi_alloc_mem's memory comes from rdmalloc_alloc of the rdmalloc that
// answers this library's rdmalloc_lookup calls (normally the copy linked in
// from librdmalloc.a; an LD_PRELOADed librdmalloc.so wins rdmalloc_* like
// malloc), so it must go back to that rdmalloc's free. A plain free() call
// here binds to the process's winner instead, which may be glibc's or
// another jemalloc; dlsym on the owner's handle searches it first.
static void (*rdmalloc_free)(void *);
static pthread_once_t rdmalloc_once = PTHREAD_ONCE_INIT;

static void find_rdmalloc_free(void) {
  Dl_info info;
  if (!dladdr((void *)&rdmalloc_lookup, &info)) return;
  void *owner = dlopen(info.dli_fname, RTLD_LAZY | RTLD_NOLOAD);
  if (owner == NULL) return;
  rdmalloc_free = (void (*)(void *))dlsym(owner, "free");
  dlclose(owner);  // drops only the reference RTLD_NOLOAD took
}

// Memory a peer may read and write: rdmalloc_alloc's remote classes.
void *minimpi_alloc_mem(size_t len) {
  return rdmalloc_alloc(len, RDMALLOC_REMOTE_READ | RDMALLOC_REMOTE_WRITE);
}

void minimpi_free_mem(void *p) {
  pthread_once(&rdmalloc_once, find_rdmalloc_free);
  if (rdmalloc_free != NULL) rdmalloc_free(p);
}

// Copies n bytes between the wire and buf as the peer's NIC would, with an
// RDMA READ or WRITE through buf's registration; through a bounce buffer
// when buf is not rdmalloc heap, or is heap registered for local access only
// (the plain heap, unless RDMALLOC_ACCESS widens it).
static int transfer(void *buf, size_t n, int to_buf) {
  if (n == 0) return MINIMPI_ZERO_COPY;
  struct rdmalloc_keys keys;
  int rc = rdmalloc_lookup(buf, n, NULL, &keys);
  int needed = to_buf ? RDMALLOC_ACCESS_REMOTE_WRITE : RDMALLOC_ACCESS_REMOTE_READ;
  if (rc == RDMALLOC_OK && (keys.access & needed) != 0) {
    rc = to_buf ? rdmalloc_dma_write(&keys, 0, wire, n) : rdmalloc_dma_read(&keys, 0, wire, n);
    return rc == RDMALLOC_OK ? MINIMPI_ZERO_COPY : rc;
  }
  if (rc != RDMALLOC_OK && rc != RDMALLOC_ENOTOURS) return rc;
  void *bounce = minimpi_alloc_mem(n);
  if (bounce == NULL) return MINIMPI_ENOMEM;
  if (!to_buf) memcpy(bounce, buf, n);
  rc = rdmalloc_lookup(bounce, n, NULL, &keys);
  if (rc == RDMALLOC_OK)
    rc = to_buf ? rdmalloc_dma_write(&keys, 0, wire, n) : rdmalloc_dma_read(&keys, 0, wire, n);
  if (rc == RDMALLOC_OK && to_buf) memcpy(buf, bounce, n);
  minimpi_free_mem(bounce);
  return rc == RDMALLOC_OK ? MINIMPI_BOUNCED : rc;
}

int minimpi_send(const void *buf, size_t len, int tag) {
  pthread_mutex_lock(&wire_lock);
  int rc = MINIMPI_EBUSY;
  if (!wire_full) {
    rc = MINIMPI_ENOMEM;
    wire = malloc(len > 0 ? len : 1);
    if (wire != NULL) {
      rc = transfer((void *)buf, len, /*to_buf=*/0);
      if (rc > 0) {
        wire_len = len;
        wire_tag = tag;
        wire_full = 1;
      } else {
        free(wire);
        wire = NULL;
      }
    }
  }
  pthread_mutex_unlock(&wire_lock);
  return rc;
}

int minimpi_recv(void *buf, size_t len, int tag, size_t *received) {
  pthread_mutex_lock(&wire_lock);
  int rc = MINIMPI_ENOMSG;
  if (wire_full && wire_tag == tag) {
    rc = MINIMPI_ETRUNC;
    if (len >= wire_len) rc = transfer(buf, wire_len, /*to_buf=*/1);
    if (rc > 0) {
      if (received != NULL) *received = wire_len;
      free(wire);
      wire = NULL;
      wire_full = 0;
    }
  }
  pthread_mutex_unlock(&wire_lock);
  return rc;
}
