// An application that knows nothing of rdmalloc's linking: it links against
// libminimpi.so only (the test also links it with -ljemalloc and preloads
// other mallocs), mallocs its buffers and sends them. It reports which
// library's malloc it got and checks that rdmalloc_lookup tells the truth
// about that memory: keys when rdmalloc's malloc won (the one embedded in
// libminimpi.so or a preloaded librdmalloc.so), RDMALLOC_ENOTOURS when
// another malloc did; and that messages move zero-copy exactly when the
// buffer's registration grants the peer's RDMA READ/WRITE.
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "allocator/rdmalloc.h"
#include "examples/embed/minimpi.h"

static int failures;

static void check(int ok, const char *what) {
  if (!ok) {
    printf("FAIL: %s\n", what);
    failures++;
  }
}

static const char *provider_of(const char *symbol) {
  Dl_info info;
  void *address = dlsym(RTLD_DEFAULT, symbol);
  if (address == NULL || !dladdr(address, &info) || info.dli_fname == NULL) return "?";
  const char *slash = strrchr(info.dli_fname, '/');
  return slash != NULL ? slash + 1 : info.dli_fname;
}

static void fill(unsigned char *p, size_t n, unsigned seed) {
  for (size_t i = 0; i < n; i++) p[i] = (unsigned char)(seed + i * 131);
}

// Sends n bytes from src, receives them into dst and checks them; each
// transfer must have moved as expected (MINIMPI_ZERO_COPY or MINIMPI_BOUNCED).
static void round_trip(void *src, void *dst, size_t n, unsigned seed, int send_how, int recv_how,
                       const char *what) {
  fill(src, n, seed);
  memset(dst, 0, n);
  int sent = minimpi_send(src, n, 7);
  size_t got = 0;
  int received = minimpi_recv(dst, n, 7, &got);
  if (sent != send_how || received != recv_how) {
    printf("%s: send=%d recv=%d, expected %d and %d\n", what, sent, received, send_how, recv_how);
    failures++;
  }
  check(got == n && memcmp(src, dst, n) == 0, "received bytes equal the sent ones");
}

int main(void) {
  const char *malloc_from = provider_of("malloc");
  const char *lookup_from = provider_of("rdmalloc_lookup");
  int rdmalloc_won = strcmp(malloc_from, lookup_from) == 0;
  printf("malloc_from=%s free_from=%s new_from=%s lookup_from=%s\n", malloc_from, provider_of("free"),
         provider_of("_Znwm"), lookup_from);
  check(strcmp(malloc_from, provider_of("free")) == 0, "malloc and free come from one library");
  int expected = rdmalloc_won ? RDMALLOC_OK : RDMALLOC_ENOTOURS;

  // The plain malloc family: rdmalloc heap exactly when rdmalloc won.
  const size_t n = 256 * 1024;
  void *buffers[5] = {NULL};
  buffers[0] = malloc(n);
  buffers[1] = calloc(1, n);
  buffers[2] = realloc(malloc(100), n);
  buffers[3] = aligned_alloc(4096, n);
  check(posix_memalign(&buffers[4], 64, n) == 0, "posix_memalign");
  int lookups_as_expected = 1;
  struct rdmalloc_keys keys;
  for (int i = 0; i < 5; i++) {
    int rc = rdmalloc_lookup(buffers[i], n, NULL, &keys);
    if (rc != expected) {
      printf("buffer %d: rdmalloc_lookup=%d, expected %d\n", i, rc, expected);
      lookups_as_expected = 0;
    }
  }
  check(lookups_as_expected, "rdmalloc_lookup answers truthfully for the malloc family");
  printf("malloc_lookup=%s\n", expected == RDMALLOC_OK ? "keys" : "ENOTOURS");

  // Messages from and into malloc'd memory: zero-copy exactly when rdmalloc
  // won and its plain heap is registered for remote access (RDMALLOC_ACCESS).
  const int remote = RDMALLOC_ACCESS_REMOTE_READ | RDMALLOC_ACCESS_REMOTE_WRITE;
  int heap_remote = rdmalloc_won && (keys.access & remote) == remote;
  int heap_how = heap_remote ? MINIMPI_ZERO_COPY : MINIMPI_BOUNCED;
  round_trip(buffers[0], buffers[1], n, 1, heap_how, heap_how, "malloc -> malloc");
  printf("malloc_transfer=%s\n", heap_remote ? "zero-copy" : "bounced");

  // The stack is never rdmalloc's.
  char on_stack[512];
  check(rdmalloc_lookup(on_stack, sizeof on_stack, NULL, &keys) == RDMALLOC_ENOTOURS, "stack is ENOTOURS");
  round_trip(on_stack, buffers[2], sizeof on_stack, 2, MINIMPI_BOUNCED, heap_how, "stack -> malloc");

  // minimpi_alloc_mem is registered for remote access whichever malloc won.
  void *registered = minimpi_alloc_mem(n);
  check(registered != NULL && rdmalloc_lookup(registered, n, NULL, &keys) == RDMALLOC_OK &&
            (keys.access & remote) == remote,
        "minimpi_alloc_mem memory has keys with remote rights");
  round_trip(registered, buffers[3], n, 3, MINIMPI_ZERO_COPY, heap_how, "alloc_mem -> malloc");
  round_trip(buffers[4], registered, n, 4, heap_how, MINIMPI_ZERO_COPY, "malloc -> alloc_mem");
  minimpi_free_mem(registered);

  for (int i = 0; i < 5; i++) free(buffers[i]);

  struct rdmalloc_stats stats;
  check(rdmalloc_stats(&stats, sizeof stats) == RDMALLOC_OK, "rdmalloc_stats");
  printf("regions_live=%llu bytes_registered=%llu lookups=%llu lookup_not_ours=%llu\n",
         (unsigned long long)stats.regions_live, (unsigned long long)stats.bytes_registered,
         (unsigned long long)stats.lookups, (unsigned long long)stats.lookup_not_ours);
  check(stats.lookups > 0 && stats.bytes_registered > 0, "the embedded heap registered memory");
  check(stats.lookup_not_ours > 0, "foreign lookups are counted");

  printf(failures == 0 ? "app: ok\n" : "app: %d failure(s)\n", failures);
  return failures == 0 ? 0 : 1;
}
