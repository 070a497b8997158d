/* An MPI program whose message buffers are malloc'd and freed every
 * iteration, the pattern a registration cache handles worst: ping-pong
 * between ranks 0 and 1 over sizes 8 B .. 4 MiB, then an allreduce over all
 * ranks. Every byte is checked against a pattern that depends on the sending
 * rank, the iteration and the size, so wrong, stale or shifted bytes are
 * caught.
 *
 * When rdmalloc is loaded (preloaded or linked), each rank also asks
 * rdmalloc_lookup for keys of every buffer it allocates and counts the hits;
 * without rdmalloc the program runs the same and says "rdmalloc absent".
 *
 * Output: rank 0's time per ping-pong iteration for each size (malloc,
 * fill, send, receive, check, free on both sides), one "rank R: ..." line per
 * rank, and a final "mpi_pingpong: PASS" or "FAIL" line. Exit status 0 only
 * if every check on every rank passed. --corrupt makes rank 1 flip one byte
 * of one reply after filling it: the negative control, which must FAIL.
 * --no-lookup makes it a plain MPI program that never calls rdmalloc, whether
 * or not rdmalloc serves its malloc.
 *
 *   mpirun -np 2 mpi_pingpong [--iters N] [--max-size BYTES] [--corrupt] [--no-lookup]
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <inttypes.h>
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "allocator/rdmalloc.h"

typedef int (*lookup_fn)(const void *, size_t, struct ibv_pd *, struct rdmalloc_keys *);
typedef const char *(*backend_fn)(void);

static lookup_fn rdmalloc_lookup_ptr;
static uint64_t lookups, lookup_hits;
static uint64_t bad_bytes, bad_buffers;
static int my_rank;
static int corrupt_one_reply;
static int no_lookup; /* a plain MPI program: never calls rdmalloc, even when it is there */

static uint64_t mix64(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebull;
  x ^= x >> 31;
  return x;
}

/* Word w of a message of `len` bytes sent by `rank` in iteration `iter`.
 * Different for neighbouring words, sizes, iterations and ranks, so a buffer
 * from another message never matches. */
static uint64_t pattern_seed(int rank, int iter, size_t len) {
  return mix64(((uint64_t)rank << 56) ^ ((uint64_t)iter << 32) ^ len);
}

static void fill(unsigned char *buf, size_t len, int rank, int iter) {
  uint64_t seed = pattern_seed(rank, iter, len);
  for (size_t off = 0; off < len; off += 8) {
    uint64_t word = mix64(seed + off / 8);
    memcpy(buf + off, &word, len - off < 8 ? len - off : 8);
  }
}

static void check(const unsigned char *buf, size_t len, int rank, int iter, const char *what) {
  uint64_t seed = pattern_seed(rank, iter, len);
  uint64_t wrong = 0;
  size_t first = 0;
  for (size_t off = 0; off < len; off += 8) {
    uint64_t word = mix64(seed + off / 8);
    const unsigned char *expected = (const unsigned char *)&word;
    for (size_t i = 0; i < 8 && off + i < len; i++) {
      if (buf[off + i] != expected[i] && wrong++ == 0) first = off + i;
    }
  }
  if (wrong) {
    bad_bytes += wrong;
    if (bad_buffers++ < 10) {
      fprintf(stderr, "rank %d: %s of %zu B, iteration %d: %" PRIu64 " wrong bytes, first at %zu\n",
              my_rank, what, len, iter, wrong, first);
    }
  }
}

/* A fresh buffer from malloc; with rdmalloc, also its keys. */
static void *fresh_buffer(size_t len) {
  void *p = malloc(len);
  if (p == NULL) {
    fprintf(stderr, "rank %d: malloc(%zu) failed\n", my_rank, len);
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  if (rdmalloc_lookup_ptr) {
    struct rdmalloc_keys keys;
    lookups++;
    if (rdmalloc_lookup_ptr(p, len, NULL, &keys) == RDMALLOC_OK) lookup_hits++;
  }
  return p;
}

/* Iterations for a message size: fewer for large messages, at least 4. */
static int iters_for(size_t len, int iters) {
  int n = (int)((size_t)iters * 16384 / (len > 16384 ? len : 16384));
  return n < 4 ? 4 : n;
}

static void ping_pong(size_t max_size, int iters) {
  const int peer = 1 - my_rank;
  if (my_rank == 0) printf("%10s %6s %14s\n", "bytes", "iters", "us/iteration");
  for (size_t len = 8; len <= max_size; len *= 2) {
    int n = iters_for(len, iters);
    double t0 = MPI_Wtime();
    for (int it = 0; it < n; it++) {
      if (my_rank == 0) {
        unsigned char *out = fresh_buffer(len);
        fill(out, len, 0, it);
        MPI_Send(out, (int)len, MPI_BYTE, peer, it, MPI_COMM_WORLD);
        free(out);
        unsigned char *in = fresh_buffer(len);
        memset(in, 0, len);
        MPI_Recv(in, (int)len, MPI_BYTE, peer, it, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        check(in, len, 1, it, "pong");
        free(in);
      } else {
        unsigned char *in = fresh_buffer(len);
        memset(in, 0, len);
        MPI_Recv(in, (int)len, MPI_BYTE, peer, it, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        check(in, len, 0, it, "ping");
        free(in);
        unsigned char *out = fresh_buffer(len);
        fill(out, len, 1, it);
        if (corrupt_one_reply && len == 4096 && it == 1) out[len / 3] ^= 0x40;
        MPI_Send(out, (int)len, MPI_BYTE, peer, it, MPI_COMM_WORLD);
        free(out);
      }
    }
    double us = (MPI_Wtime() - t0) * 1e6 / n;
    if (my_rank == 0) printf("%10zu %6d %14.1f\n", len, n, us);
  }
}

/* The contribution of `rank` to element i of the allreduce in iteration
 * `iter`; 32 bits, so sums over ranks never overflow. */
static int64_t contribution(int rank, int iter, size_t i) {
  return (int64_t)(mix64(((uint64_t)rank << 48) ^ ((uint64_t)iter << 32) ^ i) >> 32);
}

static void allreduce(int nranks, size_t max_size, int iters) {
  for (size_t count = 1; count * sizeof(int64_t) <= max_size; count *= 4) {
    size_t len = count * sizeof(int64_t);
    int n = iters_for(len, iters);
    for (int it = 0; it < n; it++) {
      int64_t *in = fresh_buffer(len);
      int64_t *sum = fresh_buffer(len);
      for (size_t i = 0; i < count; i++) in[i] = contribution(my_rank, it, i);
      MPI_Allreduce(in, sum, (int)count, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD);
      uint64_t wrong = 0;
      for (size_t i = 0; i < count; i++) {
        int64_t expected = 0;
        for (int r = 0; r < nranks; r++) expected += contribution(r, it, i);
        if (sum[i] != expected) wrong++;
      }
      if (wrong) {
        bad_bytes += wrong * sizeof(int64_t);
        if (bad_buffers++ < 10) {
          fprintf(stderr, "rank %d: allreduce of %zu elements, iteration %d: %" PRIu64 " wrong\n",
                  my_rank, count, it, wrong);
        }
      }
      free(sum);
      free(in);
    }
  }
}

int main(int argc, char **argv) {
  int iters = 50;
  size_t max_size = 4u << 20;
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--iters") == 0 && i + 1 < argc) {
      iters = atoi(argv[++i]);
    } else if (strcmp(argv[i], "--max-size") == 0 && i + 1 < argc) {
      max_size = strtoull(argv[++i], NULL, 0);
    } else if (strcmp(argv[i], "--corrupt") == 0) {
      corrupt_one_reply = 1;
    } else if (strcmp(argv[i], "--no-lookup") == 0) {
      no_lookup = 1;
    } else {
      fprintf(stderr, "usage: %s [--iters N] [--max-size BYTES] [--corrupt] [--no-lookup]\n",
              argv[0]);
      return 2;
    }
  }
  if (iters < 1 || max_size < 8 || max_size > (1u << 30)) {
    fprintf(stderr, "%s: --iters must be >= 1, --max-size in 8 .. 1 GiB\n", argv[0]);
    return 2;
  }

  MPI_Init(&argc, &argv);
  int nranks;
  MPI_Comm_rank(MPI_COMM_WORLD, &my_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &nranks);
  if (nranks < 2) {
    if (my_rank == 0) fprintf(stderr, "mpi_pingpong: needs at least 2 ranks\n");
    MPI_Abort(MPI_COMM_WORLD, 2);
  }

  /* Found only if rdmalloc is in the process (LD_PRELOAD or linked). */
  if (!no_lookup) rdmalloc_lookup_ptr = (lookup_fn)dlsym(RTLD_DEFAULT, "rdmalloc_lookup");
  backend_fn backend = (backend_fn)dlsym(RTLD_DEFAULT, "rdmalloc_backend");

  if (my_rank < 2) ping_pong(max_size, iters);
  allreduce(nranks, max_size, iters);

  if (rdmalloc_lookup_ptr) {
    printf("rank %d: pid %d rdmalloc present backend=%s lookups=%" PRIu64 " hits=%" PRIu64
           " bad_bytes=%" PRIu64 "\n",
           my_rank, (int)getpid(), backend ? backend() : "?", lookups, lookup_hits, bad_bytes);
  } else {
    printf("rank %d: pid %d %s bad_bytes=%" PRIu64 "\n", my_rank, (int)getpid(),
           no_lookup ? "plain MPI (--no-lookup)" : "rdmalloc absent", bad_bytes);
  }
  fflush(stdout);

  uint64_t total_bad = 0;
  MPI_Allreduce(&bad_bytes, &total_bad, 1, MPI_UINT64_T, MPI_SUM, MPI_COMM_WORLD);
  if (my_rank == 0) {
    printf("mpi_pingpong: %s (%" PRIu64 " wrong bytes over %d ranks)\n", total_bad ? "FAIL" : "PASS",
           total_bad, nranks);
    fflush(stdout);
  }
  MPI_Finalize();
  return total_bad ? 1 : 0;
}
