// glibc's malloc serves the program first; then libminimpi.so is dlopen'ed
// (as a plugin or a Python extension would load an MPI library). glibc keeps
// serving the program's malloc and free, before and after the load; the
// library's embedded rdmalloc serves only what is asked of it through the
// handle (minimpi_alloc_mem, dlsym(handle, "malloc")), and rdmalloc_lookup
// says RDMALLOC_ENOTOURS for glibc's memory.
//
// usage: late_load LIBRARY local|global
// exit 0: all checks passed; 1: a check failed; 2: dlopen failed (the
// message is printed as "dlopen failed: ...").
#define _GNU_SOURCE
#include <dlfcn.h>
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

static void *need(void *library, const char *symbol) {
  void *address = dlsym(library, symbol);
  if (address == NULL) {
    printf("FAIL: %s not found: %s\n", symbol, dlerror());
    exit(1);
  }
  return address;
}

static const char *provider_of(const char *symbol) {
  Dl_info info;
  void *address = dlsym(RTLD_DEFAULT, symbol);
  if (address == NULL || !dladdr(address, &info) || info.dli_fname == NULL) return "?";
  const char *slash = strrchr(info.dli_fname, '/');
  return slash != NULL ? slash + 1 : info.dli_fname;
}

int main(int argc, char **argv) {
  if (argc != 3) {
    fprintf(stderr, "usage: %s LIBRARY local|global\n", argv[0]);
    return 1;
  }
  // Memory from glibc, before the library exists in the process.
  char *early_small = malloc(100);
  char *early_large = malloc(1 << 20);
  strcpy(early_small, "glibc");
  memset(early_large, 5, 1 << 20);

  void *library = dlopen(argv[1], RTLD_NOW | (strcmp(argv[2], "global") == 0 ? RTLD_GLOBAL : RTLD_LOCAL));
  if (library == NULL) {
    printf("dlopen failed: %s\n", dlerror());
    return 2;
  }
  int (*lookup)(const void *, size_t, struct ibv_pd *, struct rdmalloc_keys *) =
      need(library, "rdmalloc_lookup");
  int (*dma_read)(const struct rdmalloc_keys *, size_t, void *, size_t) = need(library, "rdmalloc_dma_read");
  int (*send)(const void *, size_t, int) = need(library, "minimpi_send");
  int (*recv)(void *, size_t, int, size_t *) = need(library, "minimpi_recv");
  void *(*alloc_mem)(size_t) = need(library, "minimpi_alloc_mem");
  void (*free_mem)(void *) = need(library, "minimpi_free_mem");
  void *(*library_malloc)(size_t) = need(library, "malloc");
  void (*library_free)(void *) = need(library, "free");

  // Loading the library changed nothing for the program: glibc still serves
  // its malloc (even with RTLD_GLOBAL: libc is ahead in the search order).
  printf("malloc_from=%s\n", provider_of("malloc"));
  check(strcmp(provider_of("malloc"), "libc.so.6") == 0, "the program's malloc is still glibc's");
  check(library_malloc != (void *)&malloc, "dlsym(handle, \"malloc\") is the library's own");
  struct rdmalloc_keys keys;
  check(lookup(early_large, 1 << 20, NULL, &keys) == RDMALLOC_ENOTOURS, "glibc memory from before the load is ENOTOURS");
  char *late = malloc(300000);
  check(lookup(late, 300000, NULL, &keys) == RDMALLOC_ENOTOURS, "glibc memory from after the load is ENOTOURS");

  // glibc's pointers keep going to glibc's realloc and free.
  early_small = realloc(early_small, 200000);
  check(early_small != NULL && strcmp(early_small, "glibc") == 0, "glibc realloc of an early pointer");
  free(early_small);
  free(early_large);

  // The library's own malloc, reached by handle: rdmalloc heap.
  char *ours = library_malloc(300000);
  check(ours != NULL && lookup(ours, 300000, NULL, &keys) == RDMALLOC_OK, "library malloc memory has keys");

  // Memory a peer may read and write (rdmalloc_alloc's remote classes): bytes
  // move through its keys.
  char *registered = alloc_mem(300000);
  check(registered != NULL && lookup(registered, 300000, NULL, &keys) == RDMALLOC_OK, "alloc_mem has keys");
  memset(registered, 9, 300000);
  char probe[16] = {0};
  check(dma_read(&keys, 1000, probe, sizeof probe) == RDMALLOC_OK && probe[3] == 9, "dma_read through its keys");

  // A message from glibc memory (bounced) into registered memory (zero-copy), and back.
  for (int i = 0; i < 300000; i++) late[i] = (char)(i * 7);
  size_t got = 0;
  check(send(late, 300000, 1) == MINIMPI_BOUNCED, "send from glibc memory is bounced");
  check(recv(registered, 300000, 1, &got) == MINIMPI_ZERO_COPY && got == 300000,
        "recv into alloc_mem memory is zero-copy");
  check(memcmp(late, registered, 300000) == 0, "bytes arrived");
  memcpy(registered, "through rdmalloc", 17);
  check(send(registered, 17, 2) == MINIMPI_ZERO_COPY, "send from alloc_mem is zero-copy");
  check(recv(late, 17, 2, &got) == MINIMPI_BOUNCED && strcmp(late, "through rdmalloc") == 0,
        "recv into glibc memory is bounced");
  free_mem(registered);
  library_free(ours);
  free(late);

  printf(failures == 0 ? "late_load: ok\n" : "late_load: %d failure(s)\n", failures);
  return failures == 0 ? 0 : 1;
}
