// Single-process RDMA check for the soft-RoCE VM (test/vm/smoke_test.sh).
//
// Opens an RDMA device (default rxe0), registers an 8 MiB target buffer and an 8 MiB
// staging buffer, connects one RC QP to itself (RoCE v2, GID index 0), then
//   1. RDMA WRITEs the staging buffer into the target buffer and checks every byte,
//   2. changes the target buffer with the CPU, RDMA READs it back into the staging
//      buffer and checks every byte.
// Exit 0 on success, 1 on any failure (with a message on stderr).
//
// Build: gcc -O2 -Wall -o verbs_loopback verbs_loopback.c -libverbs
// Usage: verbs_loopback [-d DEVICE] [-g GID_INDEX] [-s BYTES]

#include <infiniband/verbs.h>

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define CHECK(cond, ...)                                  \
  do {                                                    \
    if (!(cond)) {                                        \
      fprintf(stderr, "verbs_loopback: " __VA_ARGS__);    \
      fprintf(stderr, " (errno %d: %s)\n", errno, strerror(errno)); \
      exit(1);                                            \
    }                                                     \
  } while (0)

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec / 1e9;
}

// Deterministic, non-repeating fill so a shifted or partial copy cannot pass.
static void fill(uint8_t *p, size_t n, uint64_t seed) {
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  for (size_t i = 0; i < n; i += 8) {
    x ^= x << 13; x ^= x >> 7; x ^= x << 17;
    memcpy(p + i, &x, n - i < 8 ? n - i : 8);
  }
}

static int verify(const uint8_t *got, const uint8_t *want, size_t n, const char *what) {
  for (size_t i = 0; i < n; i++) {
    if (got[i] != want[i]) {
      fprintf(stderr, "verbs_loopback: %s: byte %zu is 0x%02x, expected 0x%02x\n", what, i,
              got[i], want[i]);
      return 0;
    }
  }
  return 1;
}

// Posts one signaled RDMA op and waits (bounded) for its completion.
static void rdma_op(struct ibv_qp *qp, struct ibv_cq *cq, enum ibv_wr_opcode op,
                    struct ibv_mr *local, struct ibv_mr *remote, size_t len) {
  struct ibv_sge sge = {.addr = (uintptr_t)local->addr, .length = (uint32_t)len, .lkey = local->lkey};
  struct ibv_send_wr wr = {.wr_id = op, .sg_list = &sge, .num_sge = 1, .opcode = op,
                           .send_flags = IBV_SEND_SIGNALED};
  wr.wr.rdma.remote_addr = (uintptr_t)remote->addr;
  wr.wr.rdma.rkey = remote->rkey;
  struct ibv_send_wr *bad = NULL;
  CHECK(ibv_post_send(qp, &wr, &bad) == 0, "ibv_post_send failed");
  struct ibv_wc wc;
  double deadline = now_s() + 60;  // emulated NIC under TCG: ~18 MB/s
  int n;
  while ((n = ibv_poll_cq(cq, 1, &wc)) == 0) {
    CHECK(now_s() < deadline, "no completion within 60 s");
  }
  CHECK(n == 1, "ibv_poll_cq failed");
  if (wc.status != IBV_WC_SUCCESS) {
    fprintf(stderr, "verbs_loopback: completion error: %s\n", ibv_wc_status_str(wc.status));
    exit(1);
  }
}

int main(int argc, char **argv) {
  const char *dev_name = "rxe0";
  int gid_index = 0;
  size_t size = 8u << 20;
  int opt;
  while ((opt = getopt(argc, argv, "d:g:s:")) != -1) {
    switch (opt) {
      case 'd': dev_name = optarg; break;
      case 'g': gid_index = atoi(optarg); break;
      case 's': size = strtoull(optarg, NULL, 0); break;
      default:
        fprintf(stderr, "usage: %s [-d DEVICE] [-g GID_INDEX] [-s BYTES]\n", argv[0]);
        return 2;
    }
  }

  int num = 0;
  struct ibv_device **list = ibv_get_device_list(&num);
  CHECK(list, "ibv_get_device_list failed");
  struct ibv_device *dev = NULL;
  for (int i = 0; i < num; i++)
    if (strcmp(ibv_get_device_name(list[i]), dev_name) == 0) dev = list[i];
  CHECK(dev, "device %s not found among %d devices", dev_name, num);
  struct ibv_context *ctx = ibv_open_device(dev);
  CHECK(ctx, "ibv_open_device(%s) failed", dev_name);

  struct ibv_port_attr port;
  CHECK(ibv_query_port(ctx, 1, &port) == 0, "ibv_query_port failed");
  CHECK(port.state == IBV_PORT_ACTIVE, "port 1 is not ACTIVE (state %d)", port.state);
  union ibv_gid gid;
  CHECK(ibv_query_gid(ctx, 1, gid_index, &gid) == 0, "ibv_query_gid(%d) failed", gid_index);

  struct ibv_pd *pd = ibv_alloc_pd(ctx);
  CHECK(pd, "ibv_alloc_pd failed");
  uint8_t *target = aligned_alloc(4096, size), *staging = aligned_alloc(4096, size);
  uint8_t *expect = malloc(size);
  CHECK(target && staging && expect, "out of memory");
  memset(target, 0, size);
  memset(staging, 0, size);

  double t = now_s();
  int access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
  struct ibv_mr *target_mr = ibv_reg_mr(pd, target, size, access);
  CHECK(target_mr, "ibv_reg_mr(%zu bytes) failed", size);
  struct ibv_mr *staging_mr = ibv_reg_mr(pd, staging, size, IBV_ACCESS_LOCAL_WRITE);
  CHECK(staging_mr, "ibv_reg_mr(staging) failed");
  double t_reg = now_s() - t;

  struct ibv_cq *cq = ibv_create_cq(ctx, 4, NULL, NULL, 0);
  CHECK(cq, "ibv_create_cq failed");
  struct ibv_qp_init_attr qpia = {
      .send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_RC,
      .cap = {.max_send_wr = 4, .max_recv_wr = 1, .max_send_sge = 1, .max_recv_sge = 1}};
  struct ibv_qp *qp = ibv_create_qp(pd, &qpia);
  CHECK(qp, "ibv_create_qp failed");

  // RESET -> INIT -> RTR (destination = this very QP) -> RTS.
  struct ibv_qp_attr a = {.qp_state = IBV_QPS_INIT, .pkey_index = 0, .port_num = 1,
                          .qp_access_flags = access};
  CHECK(ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
                                  IBV_QP_ACCESS_FLAGS) == 0, "modify_qp INIT failed");
  memset(&a, 0, sizeof a);
  a.qp_state = IBV_QPS_RTR;
  a.path_mtu = port.active_mtu;
  a.dest_qp_num = qp->qp_num;
  a.rq_psn = 0;
  a.max_dest_rd_atomic = 1;
  a.min_rnr_timer = 12;
  a.ah_attr.is_global = 1;  // RoCE needs a GRH
  a.ah_attr.grh.dgid = gid;
  a.ah_attr.grh.sgid_index = gid_index;
  a.ah_attr.grh.hop_limit = 1;
  a.ah_attr.port_num = 1;
  CHECK(ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
                                  IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC |
                                  IBV_QP_MIN_RNR_TIMER) == 0, "modify_qp RTR failed");
  memset(&a, 0, sizeof a);
  a.qp_state = IBV_QPS_RTS;
  a.timeout = 14;
  a.retry_cnt = 7;
  a.rnr_retry = 7;
  a.sq_psn = 0;
  a.max_rd_atomic = 1;
  CHECK(ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
                                  IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC) == 0,
        "modify_qp RTS failed");

  // 1. RDMA WRITE staging -> target.
  fill(staging, size, 1);
  memcpy(expect, staging, size);
  t = now_s();
  rdma_op(qp, cq, IBV_WR_RDMA_WRITE, staging_mr, target_mr, size);
  double t_write = now_s() - t;
  if (!verify(target, expect, size, "RDMA WRITE")) return 1;

  // 2. CPU rewrites the target, RDMA READ target -> staging.
  fill(target, size, 2);
  memcpy(expect, target, size);
  memset(staging, 0, size);
  t = now_s();
  rdma_op(qp, cq, IBV_WR_RDMA_READ, staging_mr, target_mr, size);
  double t_read = now_s() - t;
  if (!verify(staging, expect, size, "RDMA READ")) return 1;

  printf("verbs_loopback: %s qp %u, %zu bytes: reg %.1f ms, WRITE %.1f MB/s, READ %.1f MB/s, "
         "bytes verified\n", dev_name, qp->qp_num, size, t_reg * 1e3, size / t_write / 1e6,
         size / t_read / 1e6);

  ibv_destroy_qp(qp);
  ibv_destroy_cq(cq);
  ibv_dereg_mr(staging_mr);
  ibv_dereg_mr(target_mr);
  ibv_dealloc_pd(pd);
  ibv_close_device(ctx);
  ibv_free_device_list(list);
  free(target);
  free(staging);
  free(expect);
  return 0;
}
