// The "two processes" check on real verbs (soft-RoCE, inside test/vm/run.sh's
// VM; target //test:two_process_vm_test). Process A (the GoogleTest test; its
// malloc is rdmalloc) mallocs buffers, gets their rkeys with rdmalloc_lookup
// and publishes (addr, len, rkey) over TCP. Process B (this binary re-exec'd
// with --role=peer, RDMALLOC_BACKEND=none, never calling rdmalloc's API) opens
// rxe0 itself, registers its own staging buffer with ibv_reg_mr, RDMA-READs
// A's buffer and checks the bytes, then RDMA-WRITEs a new pattern that A checks
// with the CPU. Between cycles A frees, reallocates and forces jemalloc to
// purge. A last cycle purges a registered buffer behind rdmalloc's back
// (negative control): the mismatch must be detected.
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <infiniband/verbs.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "test/test_util.h"

extern char** environ;

namespace rdmalloc_test {
namespace {

constexpr size_t kMiB = size_t{1} << 20;
constexpr size_t kStagingBytes = 8 * kMiB;  // B's registered staging buffer
constexpr int kAccess = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE;
constexpr int kGidIndex = 0;
constexpr double kCqLimitS = 10;
constexpr int kSockTimeoutS = 120;  // one cycle of 64 MiB under TCG, with margin


// ------------------------------------------------------------------ wire

struct QpInfo {
  uint32_t qp_num;
  uint32_t psn;
  uint8_t gid[16];
};

enum : uint32_t { kCycle = 1, kBye = 2 };

struct Request {
  uint32_t type;
  uint32_t rkey;
  uint64_t addr;
  uint64_t len;
  uint64_t seed_a;  // what B must READ
  uint64_t seed_b;  // what B WRITEs
};

struct Reply {
  int32_t status;  // 0: transfers completed; otherwise a verbs error
  uint32_t pad;
  uint64_t read_mismatches;
};

bool SendAll(int fd, const void* p, size_t n) {
  auto* b = static_cast<const char*>(p);
  while (n > 0) {
    ssize_t k = send(fd, b, n, MSG_NOSIGNAL);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) return false;
    b += k;
    n -= k;
  }
  return true;
}

bool RecvAll(int fd, void* p, size_t n) {
  auto* b = static_cast<char*>(p);
  while (n > 0) {
    ssize_t k = recv(fd, b, n, 0);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) return false;  // closed, or SO_RCVTIMEO fired
    b += k;
    n -= k;
  }
  return true;
}

void SetTimeouts(int fd, int secs) {
  timeval tv{secs, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

// ------------------------------------------------------------------ verbs

ibv_context* OpenRxe0(ibv_device*** list_out) {
  int n = 0;
  ibv_device** list = ibv_get_device_list(&n);
  ibv_context* ctx = nullptr;
  for (int i = 0; list != nullptr && i < n && ctx == nullptr; i++)
    if (strcmp(ibv_get_device_name(list[i]), "rxe0") == 0) ctx = ibv_open_device(list[i]);
  *list_out = list;
  return ctx;
}

ibv_qp* CreateRcQp(ibv_pd* pd, ibv_cq* cq) {
  ibv_qp_init_attr ia;
  memset(&ia, 0, sizeof ia);
  ia.send_cq = cq;
  ia.recv_cq = cq;
  ia.qp_type = IBV_QPT_RC;
  ia.cap.max_send_wr = 4;
  ia.cap.max_recv_wr = 1;
  ia.cap.max_send_sge = 1;
  ia.cap.max_recv_sge = 1;
  return ibv_create_qp(pd, &ia);
}

// RESET -> INIT -> RTR -> RTS towards `remote` (attributes as verbs_loopback.c).
const char* ConnectQp(ibv_qp* qp, ibv_mtu mtu, const QpInfo& local, const QpInfo& remote) {
  ibv_qp_attr a;
  memset(&a, 0, sizeof a);
  a.qp_state = IBV_QPS_INIT;
  a.pkey_index = 0;
  a.port_num = 1;
  a.qp_access_flags = kAccess;
  if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS))
    return "modify_qp INIT";
  memset(&a, 0, sizeof a);
  a.qp_state = IBV_QPS_RTR;
  a.path_mtu = mtu;
  a.dest_qp_num = remote.qp_num;
  a.rq_psn = remote.psn;
  a.max_dest_rd_atomic = 1;
  a.min_rnr_timer = 12;
  a.ah_attr.is_global = 1;
  memcpy(a.ah_attr.grh.dgid.raw, remote.gid, 16);
  a.ah_attr.grh.sgid_index = kGidIndex;
  a.ah_attr.grh.hop_limit = 1;
  a.ah_attr.port_num = 1;
  if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
                                IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER))
    return "modify_qp RTR";
  memset(&a, 0, sizeof a);
  a.qp_state = IBV_QPS_RTS;
  a.timeout = 14;
  a.retry_cnt = 7;
  a.rnr_retry = 7;
  a.sq_psn = local.psn;
  a.max_rd_atomic = 1;
  if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
                                IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC))
    return "modify_qp RTS";
  return nullptr;
}

// ------------------------------------------------------------------ process B

// One RDMA op (READ or WRITE) of n bytes between B's staging and A's memory;
// 0 on success, else a nonzero code. CQ polling is bounded by kCqLimitS.
int PeerOp(ibv_qp* qp, ibv_cq* cq, ibv_wr_opcode op, ibv_mr* mr, uint64_t raddr, uint32_t rkey,
           size_t n) {
  ibv_sge sge;
  sge.addr = reinterpret_cast<uintptr_t>(mr->addr);
  sge.length = static_cast<uint32_t>(n);
  sge.lkey = mr->lkey;
  ibv_send_wr wr, *bad = nullptr;
  memset(&wr, 0, sizeof wr);
  wr.wr_id = 7;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.opcode = op;
  wr.send_flags = IBV_SEND_SIGNALED;
  wr.wr.rdma.remote_addr = raddr;
  wr.wr.rdma.rkey = rkey;
  if (ibv_post_send(qp, &wr, &bad) != 0) return 1000;
  double deadline = NowSeconds() + kCqLimitS;
  ibv_wc wc;
  for (;;) {
    int k = ibv_poll_cq(cq, 1, &wc);
    if (k < 0) return 1001;
    if (k == 1) return wc.status == IBV_WC_SUCCESS ? 0 : 2000 + wc.status;
    if (NowSeconds() > deadline) return 1002;
  }
}

#define PEER_DIE(...)                          \
  do {                                         \
    fprintf(stderr, "peer: " __VA_ARGS__);     \
    fprintf(stderr, " (errno %d)\n", errno);   \
    _exit(3);                                  \
  } while (0)

int PeerMain(int port) {
  alarm(600);  // the last resort: never outlive the VM run
  ibv_device** list = nullptr;
  ibv_context* ctx = OpenRxe0(&list);
  if (ctx == nullptr) PEER_DIE("cannot open rxe0");
  ibv_port_attr pa;
  if (ibv_query_port(ctx, 1, &pa) != 0) PEER_DIE("ibv_query_port");
  ibv_pd* pd = ibv_alloc_pd(ctx);
  if (pd == nullptr) PEER_DIE("ibv_alloc_pd");
  void* staging = mmap(nullptr, kStagingBytes, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (staging == MAP_FAILED) PEER_DIE("mmap staging");
  ibv_mr* mr = ibv_reg_mr(pd, staging, kStagingBytes, IBV_ACCESS_LOCAL_WRITE);
  if (mr == nullptr) PEER_DIE("ibv_reg_mr staging");
  ibv_cq* cq = ibv_create_cq(ctx, 8, nullptr, nullptr, 0);
  if (cq == nullptr) PEER_DIE("ibv_create_cq");
  ibv_qp* qp = CreateRcQp(pd, cq);
  if (qp == nullptr) PEER_DIE("ibv_create_qp");

  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) PEER_DIE("socket");
  SetTimeouts(fd, kSockTimeoutS);
  sockaddr_in sa;
  memset(&sa, 0, sizeof sa);
  sa.sin_family = AF_INET;
  sa.sin_port = htons(static_cast<uint16_t>(port));
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa) != 0) PEER_DIE("connect");

  QpInfo mine, theirs;
  memset(&mine, 0, sizeof mine);
  mine.qp_num = qp->qp_num;
  mine.psn = 0x2000 + (getpid() & 0xfff);
  union ibv_gid gid;
  if (ibv_query_gid(ctx, 1, kGidIndex, &gid) != 0) PEER_DIE("ibv_query_gid");
  memcpy(mine.gid, gid.raw, 16);
  if (!SendAll(fd, &mine, sizeof mine) || !RecvAll(fd, &theirs, sizeof theirs))
    PEER_DIE("qp info exchange");
  if (const char* err = ConnectQp(qp, pa.active_mtu, mine, theirs)) PEER_DIE("%s", err);
  char ready = 'R';  // A posts its first request only after both sides reach RTS
  if (!SendAll(fd, &ready, 1)) PEER_DIE("ready");

  int cycles = 0;
  for (;;) {
    Request rq;
    if (!RecvAll(fd, &rq, sizeof rq)) PEER_DIE("recv request after %d cycles", cycles);
    if (rq.type == kBye) break;
    if (rq.type != kCycle) PEER_DIE("bad request type %u", rq.type);
    Reply rp;
    memset(&rp, 0, sizeof rp);
    // READ A's buffer in chunks and check pattern(seed_a).
    for (size_t off = 0; off < rq.len && rp.status == 0; off += kStagingBytes) {
      size_t n = std::min<size_t>(kStagingBytes, rq.len - off);
      memset(staging, 0xA5, n);
      rp.status = PeerOp(qp, cq, IBV_WR_RDMA_READ, mr, rq.addr + off, rq.rkey, n);
      if (rp.status == 0) rp.read_mismatches += WordMismatches(staging, off, n, rq.seed_a);
    }
    // WRITE pattern(seed_b) over it.
    for (size_t off = 0; off < rq.len && rp.status == 0; off += kStagingBytes) {
      size_t n = std::min<size_t>(kStagingBytes, rq.len - off);
      FillWords(staging, off, n, rq.seed_b);
      rp.status = PeerOp(qp, cq, IBV_WR_RDMA_WRITE, mr, rq.addr + off, rq.rkey, n);
    }
    if (!SendAll(fd, &rp, sizeof rp)) PEER_DIE("send reply");
    if (rp.status != 0) {
      fprintf(stderr, "peer: verbs error %d in cycle %d (len %" PRIu64 ")\n", rp.status, cycles,
              rq.len);
      _exit(4);  // the QP is in error now
    }
    cycles++;
  }
  close(fd);
  int bad = 0;
  bad |= ibv_destroy_qp(qp) != 0;
  bad |= ibv_destroy_cq(cq) != 0;
  bad |= ibv_dereg_mr(mr) != 0;
  bad |= ibv_dealloc_pd(pd) != 0;
  bad |= ibv_close_device(ctx) != 0;
  ibv_free_device_list(list);
  munmap(staging, kStagingBytes);
  fprintf(stderr, "peer: served %d cycles, exiting %d\n", cycles, bad);
  return bad;
}

// ------------------------------------------------------------------ process A

// B, started before A registers anything: /proc/self/exe --role=peer PORT with
// RDMALLOC_BACKEND=none (B's malloc registers nothing; B is the remote peer).
pid_t SpawnPeer(int port) {
  std::vector<std::string> env_s;
  for (char** e = environ; *e != nullptr; e++)
    if (strncmp(*e, "RDMALLOC_BACKEND=", 17) != 0) env_s.push_back(*e);
  env_s.push_back("RDMALLOC_BACKEND=none");
  std::vector<char*> envp;
  for (auto& s : env_s) envp.push_back(&s[0]);
  envp.push_back(nullptr);
  std::string port_s = std::to_string(port);
  char exe[] = "/proc/self/exe";
  char role[] = "--role=peer";
  char* argv[] = {exe, role, &port_s[0], nullptr};
  pid_t pid = -1;
  int rc = posix_spawn(&pid, exe, nullptr, nullptr, argv, envp.data());
  return rc == 0 ? pid : -1;
}

// Waits up to `secs` for pid; kills it if it does not exit. Returns the status.
int WaitBounded(pid_t pid, double secs, bool* exited) {
  int status = 0;
  double deadline = NowSeconds() + secs;
  for (;;) {
    pid_t r = waitpid(pid, &status, WNOHANG);
    if (r == pid) {
      *exited = true;
      return status;
    }
    if (r < 0 || NowSeconds() > deadline) break;
    usleep(20000);
  }
  kill(pid, SIGKILL);
  waitpid(pid, &status, 0);
  *exited = false;
  return status;
}

struct PeerGuard {
  pid_t pid = -1;
  ~PeerGuard() {
    if (pid > 0) {
      bool exited;
      WaitBounded(pid, 0, &exited);
    }
  }
};

const size_t kSizes[] = {8,          100,       100,       4096,      65536,    65536,
                         kMiB,       3 * 1000,  8 * kMiB,  8 * kMiB,  40 * kMiB, 64 * kMiB,
                         64 * kMiB,  777,       kMiB + 8,  4 * kMiB + 13};
constexpr int kCycles = 52;

TEST(TwoProcessVm, PeerReadsAndWritesRdmallocHeapAcrossReallocAndPurge) {
  ASSERT_STREQ(rdmalloc_backend(), "verbs");

  // Listen first, start B before A registers anything.
  int lfd = socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(lfd, 0);
  sockaddr_in sa;
  memset(&sa, 0, sizeof sa);
  sa.sin_family = AF_INET;
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  sa.sin_port = 0;
  ASSERT_EQ(bind(lfd, reinterpret_cast<sockaddr*>(&sa), sizeof sa), 0) << strerror(errno);
  ASSERT_EQ(listen(lfd, 1), 0);
  socklen_t sl = sizeof sa;
  ASSERT_EQ(getsockname(lfd, reinterpret_cast<sockaddr*>(&sa), &sl), 0);
  int port = ntohs(sa.sin_port);

  PeerGuard peer;
  peer.pid = SpawnPeer(port);
  ASSERT_GT(peer.pid, 0) << "posix_spawn failed";
  printf("two-process: A pid %d, B pid %d, port %d\n", getpid(), peer.pid, port);

  pollfd pfd{lfd, POLLIN, 0};
  ASSERT_EQ(poll(&pfd, 1, 30000), 1) << "B did not connect within 30 s";
  int fd = accept(lfd, nullptr, nullptr);
  ASSERT_GE(fd, 0);
  close(lfd);
  SetTimeouts(fd, kSockTimeoutS);

  // A's verbs: its own context and PD, handed to rdmalloc; a passive RC QP.
  ibv_device** list = nullptr;
  ibv_context* ctx = OpenRxe0(&list);
  ASSERT_NE(ctx, nullptr) << "cannot open rxe0";
  ibv_port_attr pa;
  ASSERT_EQ(ibv_query_port(ctx, 1, &pa), 0);
  ibv_pd* pd = ibv_alloc_pd(ctx);
  ASSERT_NE(pd, nullptr);
  ASSERT_EQ(rdmalloc_add_pd(pd, RDMALLOC_ACCESS_LOCAL_WRITE | RDMALLOC_ACCESS_REMOTE_READ |
                                    RDMALLOC_ACCESS_REMOTE_WRITE),
            RDMALLOC_OK);
  ibv_cq* cq = ibv_create_cq(ctx, 8, nullptr, nullptr, 0);
  ASSERT_NE(cq, nullptr);
  ibv_qp* qp = CreateRcQp(pd, cq);
  ASSERT_NE(qp, nullptr);

  QpInfo mine, theirs;
  memset(&mine, 0, sizeof mine);
  mine.qp_num = qp->qp_num;
  mine.psn = 0x1000;
  union ibv_gid gid;
  ASSERT_EQ(ibv_query_gid(ctx, 1, kGidIndex, &gid), 0);
  memcpy(mine.gid, gid.raw, 16);
  ASSERT_TRUE(RecvAll(fd, &theirs, sizeof theirs)) << "B's qp info";
  ASSERT_TRUE(SendAll(fd, &mine, sizeof mine));
  const char* err = ConnectQp(qp, pa.active_mtu, mine, theirs);
  ASSERT_EQ(err, nullptr) << err << " errno " << errno;
  char ready = 0;
  ASSERT_TRUE(RecvAll(fd, &ready, 1));
  ASSERT_EQ(ready, 'R');
  printf("two-process: QPs connected (A qp %u, B qp %u, mtu %d)\n", qp->qp_num, theirs.qp_num,
         128 << pa.active_mtu);

  struct rdmalloc_stats s0 = Stats();
  size_t total_read_bad = 0, total_cpu_bad = 0, bytes = 0;
  int purges = 0;
  void* p = nullptr;
  size_t prev = 0;
  double t0 = NowSeconds();
  for (int c = 0; c < kCycles; c++) {
    size_t n = kSizes[c % (sizeof kSizes / sizeof kSizes[0])];
    // Free and re-malloc every cycle (same size or another); the previous
    // buffer is freed only after the new one is taken, half of the time, so
    // the two do not always land at the same address.
    void* old = p;
    if (c % 2 == 0) {
      free(old);
      old = nullptr;
    }
    p = malloc(n);
    ASSERT_NE(p, nullptr) << "malloc(" << n << ")";
    free(old);
    if (c % 4 == 3) {
      ForceDecay();
      purges++;
      // ...and allocate again after the purge.
      free(p);
      p = malloc(n);
      ASSERT_NE(p, nullptr);
    }
    uint64_t seed_a = 1000 + 2 * c, seed_b = 1000 + 2 * c + 1;
    FillWords(p, 0, n, seed_a);
    rdmalloc_keys k;
    int rc = rdmalloc_lookup(p, n, pd, &k);
    ASSERT_EQ(rc, RDMALLOC_OK) << "cycle " << c << " size " << n << " reg_errno " << k.reg_errno;
    ASSERT_NE(k.mr, nullptr);

    Request rq{kCycle, k.rkey, reinterpret_cast<uintptr_t>(p), n, seed_a, seed_b};
    ASSERT_TRUE(SendAll(fd, &rq, sizeof rq)) << "cycle " << c;
    Reply rp;
    ASSERT_TRUE(RecvAll(fd, &rp, sizeof rp)) << "no reply from B in cycle " << c;
    ASSERT_EQ(rp.status, 0) << "B's verbs error in cycle " << c << " (size " << n << ")";
    size_t cpu_bad = WordMismatches(p, 0, n, seed_b);
    total_read_bad += rp.read_mismatches;
    total_cpu_bad += cpu_bad;
    bytes += n;
    if (c < 3 || c % 8 == 7 || rp.read_mismatches || cpu_bad || n != prev)
      printf("cycle %2d: %9zu bytes at %p rkey 0x%08x%s: B's READ mismatches %" PRIu64
             ", A's CPU mismatches after B's WRITE %zu\n",
             c, n, p, k.rkey, c % 4 == 3 ? " (after purge)" : "", rp.read_mismatches, cpu_bad);
    EXPECT_EQ(rp.read_mismatches, 0u) << "cycle " << c << " size " << n;
    EXPECT_EQ(cpu_bad, 0u) << "cycle " << c << " size " << n;
    prev = n;
    fflush(stdout);
  }
  free(p);
  ForceDecay();
  double dt = NowSeconds() - t0;
  printf("two-process: %d cycles, %.1f MiB each way, %d forced purges, %.1f s: READ mismatches "
         "%zu, CPU mismatches %zu\n",
         kCycles, bytes / double(kMiB), purges, dt, total_read_bad, total_cpu_bad);

  // Negative control: purge a registered, page-aligned 1 MiB buffer behind
  // rdmalloc's back. The CPU then writes into fresh pages while the MR keeps
  // the old ones: B's READ must not see the CPU's pattern, and B's WRITE must
  // not reach what the CPU sees.
  {
    const size_t n = kMiB;
    void* raw = nullptr;
    ASSERT_EQ(posix_memalign(&raw, n, n), 0);
    rdmalloc_keys k;
    ASSERT_EQ(rdmalloc_lookup(raw, n, pd, &k), RDMALLOC_OK);
    FillWords(raw, 0, n, 5000);
    ASSERT_EQ(madvise(raw, n, MADV_DONTNEED), 0);
    FillWords(raw, 0, n, 5001);
    Request rq{kCycle, k.rkey, reinterpret_cast<uintptr_t>(raw), n, 5001, 5002};
    ASSERT_TRUE(SendAll(fd, &rq, sizeof rq));
    Reply rp;
    ASSERT_TRUE(RecvAll(fd, &rp, sizeof rp)) << "no reply from B in the negative control";
    ASSERT_EQ(rp.status, 0);
    size_t cpu_bad = WordMismatches(raw, 0, n, 5002);
    printf("negative control: %zu bytes, purged behind rdmalloc's back: B's READ mismatches %" PRIu64
           " (expected > %zu), A's CPU mismatches after B's WRITE %zu: %s\n",
           n, rp.read_mismatches, n / 2, cpu_bad,
           rp.read_mismatches > n / 2 && cpu_bad > n / 2 ? "detected" : "NOT DETECTED");
    EXPECT_GT(rp.read_mismatches, n / 2) << "B's READ saw the CPU's bytes after the purge";
    EXPECT_GT(cpu_bad, n / 2) << "B's WRITE reached the CPU's fresh pages after the purge";
    // Deliberately not freed: these pages no longer match their MR.
  }

  Request bye{kBye, 0, 0, 0, 0, 0};
  ASSERT_TRUE(SendAll(fd, &bye, sizeof bye));
  bool exited = false;
  int status = WaitBounded(peer.pid, 30, &exited);
  peer.pid = -1;
  ASSERT_TRUE(exited) << "B did not exit within 30 s";
  ASSERT_TRUE(WIFEXITED(status)) << "B status " << status;
  EXPECT_EQ(WEXITSTATUS(status), 0);
  close(fd);

  struct rdmalloc_stats s = Stats();
  printf("rdmalloc_stats: reg_calls %" PRIu64 " (+%" PRIu64 " in this test), dereg_calls %" PRIu64
         " (+%" PRIu64 "), reg_failures %" PRIu64 ", lookups %" PRIu64 " (%" PRIu64
         " slow), regions created %" PRIu64 ", released %" PRIu64 ", live %" PRIu64 "\n",
         s.reg_calls, s.reg_calls - s0.reg_calls, s.dereg_calls, s.dereg_calls - s0.dereg_calls,
         s.reg_failures, s.lookups, s.lookup_slow, s.regions_created, s.regions_released,
         s.regions_live);
  EXPECT_EQ(s.reg_failures, 0u);

  EXPECT_EQ(ibv_destroy_qp(qp), 0);
  EXPECT_EQ(ibv_destroy_cq(cq), 0);
  // The negative control's buffer is still registered under pd: leave pd with
  // rdmalloc (and the context open) rather than pull it from under the heap.
  ibv_free_device_list(list);
}

}  // namespace
}  // namespace rdmalloc_test

int main(int argc, char** argv) {
  if (argc == 3 && strcmp(argv[1], "--role=peer") == 0)
    return rdmalloc_test::PeerMain(atoi(argv[2]));
  testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
