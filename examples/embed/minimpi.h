/* minimpi: a toy message-passing library that embeds rdmalloc, the way an MPI
 * library embeds its allocator. Messages move through rdmalloc's registrations
 * (rdmalloc_dma_read/write stand in for the peer's NIC); buffers that are not
 * rdmalloc heap, or whose registration does not grant the peer's RDMA
 * READ/WRITE, go through a bounce buffer, as MPI libraries do with memory
 * they cannot use directly. One message in flight at a time. */
#ifndef MINIMPI_H
#define MINIMPI_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Positive results of send/recv: how the bytes moved. */
enum {
  MINIMPI_ZERO_COPY = 1, /* straight through the buffer's own registration */
  MINIMPI_BOUNCED = 2    /* copied via a bounce buffer from minimpi_alloc_mem */
};

/* Errors are negative: rdmalloc's RDMALLOC_E* codes pass through as they are,
 * minimpi's own are below them. */
enum {
  MINIMPI_EBUSY = -100,  /* a message is already in flight */
  MINIMPI_ENOMSG = -101, /* no message with that tag */
  MINIMPI_ETRUNC = -102, /* receive buffer smaller than the message */
  MINIMPI_ENOMEM = -103
};

int minimpi_send(const void *buf, size_t len, int tag);
/* On success *received (if not NULL) is the message length. */
int minimpi_recv(void *buf, size_t len, int tag, size_t *received);

/* Memory a peer may read and write (MPI_Alloc_mem), whichever malloc won the
 * process: rdmalloc_alloc with RDMALLOC_REMOTE_READ | RDMALLOC_REMOTE_WRITE.
 * Free it with minimpi_free_mem only. */
void *minimpi_alloc_mem(size_t len);
void minimpi_free_mem(void *p);

#ifdef __cplusplus
}
#endif
#endif /* MINIMPI_H */
