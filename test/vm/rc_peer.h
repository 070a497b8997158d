// Process B of the real-verbs two-process tests (inside test/vm/run.sh's VM,
// or in the second VM of run_pair.sh): a plain verbs peer that opens rxe0
// itself, connects an RC QP to process A over a TCP socket, and per request
// RDMA-READs A's buffer (checking the word pattern) and RDMA-WRITEs a new one.
// Shared by //test:two_process_vm_test (A uses rdmalloc_lookup) and
// //test:interpose_vm_test, interpose_pair_vm_test (A is a plain verbs
// program calling ibv_reg_mr); nothing here includes rdmalloc.h.
#ifndef RDMALLOC_TEST_VM_RC_PEER_H_
#define RDMALLOC_TEST_VM_RC_PEER_H_

#include <arpa/inet.h>
#include <errno.h>
#include <infiniband/verbs.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <spawn.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <string>
#include <vector>

#include "test/pattern.h"

extern char** environ;

namespace rdmalloc_test {

constexpr size_t kMiB = size_t{1} << 20;
constexpr size_t kStagingBytes = 8 * kMiB;  // B's registered staging buffer
constexpr int kAccess = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE;
constexpr double kCqLimitS = 10;
constexpr int kSockTimeoutS = 120;  // one cycle of 64 MiB under TCG, with margin
constexpr double kConnectLimitS = 120;  // A's guest of a pair may still be booting


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

inline bool SendAll(int fd, const void* p, size_t n) {
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

inline bool RecvAll(int fd, void* p, size_t n) {
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

inline void SetTimeouts(int fd, int secs) {
  timeval tv{secs, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

inline sockaddr_in LoopbackAddr(int port) {
  sockaddr_in sa;
  memset(&sa, 0, sizeof sa);
  sa.sin_family = AF_INET;
  sa.sin_port = htons(static_cast<uint16_t>(port));
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  return sa;
}

// "A.B.C.D:PORT" (A in the other VM of a pair); false if it is not that.
inline bool ParseIpPort(const char* s, sockaddr_in* out) {
  const char* colon = strrchr(s, ':');
  if (colon == nullptr) return false;
  std::string ip(s, colon);
  char* end = nullptr;
  long port = strtol(colon + 1, &end, 10);
  *out = LoopbackAddr(0);
  out->sin_port = htons(static_cast<uint16_t>(port));
  return *end == '\0' && port > 0 && port < 65536 && inet_pton(AF_INET, ip.c_str(), &out->sin_addr) == 1;
}

// ------------------------------------------------------------------ verbs

inline ibv_context* OpenRxe0(ibv_device*** list_out) {
  int n = 0;
  ibv_device** list = ibv_get_device_list(&n);
  ibv_context* ctx = nullptr;
  for (int i = 0; list != nullptr && i < n && ctx == nullptr; i++)
    if (strcmp(ibv_get_device_name(list[i]), "rxe0") == 0) ctx = ibv_open_device(list[i]);
  *list_out = list;
  return ctx;
}

inline ibv_qp* CreateRcQp(ibv_pd* pd, ibv_cq* cq) {
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

// The source GID on port 1, by content rather than by index; its index, or -1.
// rxe speaks RoCEv2 only, and its table has an entry per address of its netdev:
// the IPv6 link-local one (index 0 in practice) and, when the netdev has an
// IPv4 address, the IPv4-mapped one (::ffff:a.b.c.d). The IPv4-mapped entry is
// taken when there is one: across the VM pair's link (run_pair.sh) it is the
// address the guests are configured with, resolved by ARP like any IPv4
// packet, and it depends neither on the table's order nor on IPv6 being up.
// Without an IPv4 address (one VM, rxe on a dummy netdev) only the link-local
// entry exists, and it is used. Both sides choose by the same rule, so their
// GIDs are of one family.
inline int PickGid(ibv_context* ctx, const ibv_port_attr& pa, ibv_gid* out) {
  static const uint8_t kV4Mapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
  int first = -1;
  for (int i = 0; i < pa.gid_tbl_len; i++) {
    ibv_gid g;
    if (ibv_query_gid(ctx, 1, i, &g) != 0 || (g.global.subnet_prefix == 0 && g.global.interface_id == 0))
      continue;
    if (memcmp(g.raw, kV4Mapped, sizeof kV4Mapped) == 0) {
      *out = g;
      return i;
    }
    if (first < 0) {
      first = i;
      *out = g;
    }
  }
  return first;
}

// RESET -> INIT -> RTR -> RTS towards `remote` from source GID `sgid_index`
// (attributes as verbs_loopback.c).
inline const char* ConnectQp(ibv_qp* qp, ibv_mtu mtu, int sgid_index, const QpInfo& local,
                             const QpInfo& remote) {
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
  a.ah_attr.grh.sgid_index = static_cast<uint8_t>(sgid_index);
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
inline int PeerOp(ibv_qp* qp, ibv_cq* cq, ibv_wr_opcode op, ibv_mr* mr, uint64_t raddr, uint32_t rkey,
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

// B connects to A at `a` (retrying until A listens) and serves its requests.
inline int PeerMain(const sockaddr_in& a) {
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

  int fd = -1;
  for (double deadline = NowSeconds() + kConnectLimitS;;) {
    fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) PEER_DIE("socket");
    if (connect(fd, reinterpret_cast<const sockaddr*>(&a), sizeof a) == 0) break;
    close(fd);
    if (NowSeconds() > deadline) PEER_DIE("connect to A");
    usleep(100000);
  }
  SetTimeouts(fd, kSockTimeoutS);

  QpInfo mine, theirs;
  memset(&mine, 0, sizeof mine);
  mine.qp_num = qp->qp_num;
  mine.psn = 0x2000 + (getpid() & 0xfff);
  ibv_gid gid{};
  int gid_index = PickGid(ctx, pa, &gid);
  if (gid_index < 0) PEER_DIE("no GID on rxe0");
  memcpy(mine.gid, gid.raw, 16);
  if (!SendAll(fd, &mine, sizeof mine) || !RecvAll(fd, &theirs, sizeof theirs))
    PEER_DIE("qp info exchange");
  if (const char* err = ConnectQp(qp, pa.active_mtu, gid_index, mine, theirs)) PEER_DIE("%s", err);
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

// Process B: this binary again, `/proc/self/exe --role=peer PORT`, with the
// caller's environment less every variable starting with one of `drop`, plus
// `add` (nullptr: nothing). Returns its pid, or -1.
inline pid_t SpawnPeer(int port, std::initializer_list<const char*> drop, const char* add) {
  std::vector<std::string> env_s;
  for (char** e = environ; *e != nullptr; e++) {
    bool keep = true;
    for (const char* d : drop) keep = keep && strncmp(*e, d, strlen(d)) != 0;
    if (keep) env_s.push_back(*e);
  }
  if (add != nullptr) env_s.push_back(add);
  std::vector<char*> envp;
  for (auto& s : env_s) envp.push_back(&s[0]);
  envp.push_back(nullptr);
  std::string port_s = std::to_string(port);
  char exe[] = "/proc/self/exe";
  char role[] = "--role=peer";
  char* argv[] = {exe, role, &port_s[0], nullptr};
  pid_t pid = -1;
  return posix_spawn(&pid, exe, nullptr, nullptr, argv, envp.data()) == 0 ? pid : -1;
}

// Waits up to `secs` for pid; kills it if it does not exit. Returns the status.
inline int WaitBounded(pid_t pid, double secs, bool* exited) {
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

}  // namespace rdmalloc_test

#endif  // RDMALLOC_TEST_VM_RC_PEER_H_
