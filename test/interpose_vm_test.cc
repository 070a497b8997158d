// A plain verbs program, run in the soft-RoCE VM (//test:interpose_vm_test):
// it never includes rdmalloc.h and is not linked with rdmalloc; the test
// preloads librdmalloc.so into it, or not. Process A (this program) mallocs a
// fresh buffer per cycle, ibv_reg_mr's it with remote rights, and publishes
// (addr, len, rkey) to process B (this binary again, --role=peer, with
// glibc's malloc), which RDMA-READs the pattern A wrote and RDMA-WRITEs
// another that A checks with the CPU; then A ibv_dereg_mr's and frees. A
// counts kernel registrations itself: a registration pins pages, which the
// kernel accounts in VmPin (/proc/self/status), so "VmPin grew across
// ibv_reg_mr" is a kernel registration, whatever rdmalloc says.
//
// A last phase registers a buffer, frees it with the MR still live, churns
// until jemalloc would give its region back, then checks through the MR that
// the NIC and the CPU still see the same pages (rdmalloc only: glibc unmaps
// large freed blocks, and the CPU could not even touch them).
//
// In one VM, A spawns B itself (over loopback). Across the two VMs of
// test/vm/run_pair.sh, A listens on a port and B is started in the other VM
// with the address to connect to (//test:interpose_pair_vm_test).
//
//   interpose_vm_test --expect=served|forwarded [--cycles=N] [--after-free] [--listen=PORT]
//   interpose_vm_test --role=peer --connect=IP:PORT      (B, for --listen)
#include <arpa/inet.h>
#include <errno.h>
#include <infiniband/verbs.h>
#include <netinet/in.h>
#include <poll.h>
#include <spawn.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "test/address_only.h"
#include "test/proc_status.h"
#include "test/vm/rc_peer.h"

extern char** environ;

namespace rdmalloc_test {
namespace {

#define CHECK(cond, ...)                                   \
  do {                                                     \
    if (!(cond)) {                                         \
      fprintf(stderr, "FAIL: %s: ", #cond);                \
      fprintf(stderr, __VA_ARGS__);                        \
      fprintf(stderr, " (errno %d)\n", errno);             \
      exit(1);                                             \
    }                                                      \
  } while (0)

struct Link {
  int fd = -1;
  ibv_context* ctx = nullptr;
  ibv_pd* pd = nullptr;
  ibv_cq* cq = nullptr;
  ibv_qp* qp = nullptr;
  pid_t peer = -1;
};

// listen_port 0: spawn B here, over loopback; else wait for B from anywhere.
Link Connect(int listen_port) {
  Link l;
  int lfd = socket(AF_INET, SOCK_STREAM, 0);
  CHECK(lfd >= 0, "socket");
  sockaddr_in sa = LoopbackAddr(listen_port);
  if (listen_port != 0) {
    sa.sin_addr.s_addr = htonl(INADDR_ANY);
    int one = 1;  // the runs of a pair reuse the port at once
    CHECK(setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) == 0, "SO_REUSEADDR");
  }
  CHECK(bind(lfd, reinterpret_cast<sockaddr*>(&sa), sizeof sa) == 0, "bind");
  CHECK(listen(lfd, 1) == 0, "listen");
  socklen_t sl = sizeof sa;
  CHECK(getsockname(lfd, reinterpret_cast<sockaddr*>(&sa), &sl) == 0, "getsockname");
  if (listen_port == 0) {
    // B gets glibc's malloc and no rdmalloc settings: a remote peer of its own.
    l.peer = SpawnPeer(ntohs(sa.sin_port), {"LD_PRELOAD=", "RDMALLOC_"}, nullptr);
    CHECK(l.peer > 0, "spawn B");
  }
  pollfd pfd{lfd, POLLIN, 0};
  int limit_s = listen_port == 0 ? 30 : static_cast<int>(kConnectLimitS);
  CHECK(poll(&pfd, 1, limit_s * 1000) == 1, "B did not connect within %d s", limit_s);
  sockaddr_in from;
  socklen_t fl = sizeof from;
  l.fd = accept(lfd, reinterpret_cast<sockaddr*>(&from), &fl);
  CHECK(l.fd >= 0, "accept");
  close(lfd);
  SetTimeouts(l.fd, kSockTimeoutS);
  char host[64] = "?", from_s[INET_ADDRSTRLEN] = "?";
  gethostname(host, sizeof host - 1);
  inet_ntop(AF_INET, &from.sin_addr, from_s, sizeof from_s);
  printf("A on %s: B connected from %s\n", host, from_s);

  ibv_device** list = nullptr;
  l.ctx = OpenRxe0(&list);
  CHECK(l.ctx != nullptr, "cannot open rxe0");
  ibv_port_attr pa;
  CHECK(ibv_query_port(l.ctx, 1, &pa) == 0, "ibv_query_port");
  l.pd = ibv_alloc_pd(l.ctx);
  CHECK(l.pd != nullptr, "ibv_alloc_pd");
  ibv_cq* cq = l.cq = ibv_create_cq(l.ctx, 8, nullptr, nullptr, 0);
  CHECK(cq != nullptr, "ibv_create_cq");
  ibv_qp* qp = l.qp = CreateRcQp(l.pd, cq);
  CHECK(qp != nullptr, "ibv_create_qp");
  QpInfo mine, theirs;
  memset(&mine, 0, sizeof mine);
  mine.qp_num = qp->qp_num;
  mine.psn = 0x1000;
  ibv_gid gid{};
  int gid_index = PickGid(l.ctx, pa, &gid);
  CHECK(gid_index >= 0, "no GID on rxe0");
  memcpy(mine.gid, gid.raw, 16);
  CHECK(RecvAll(l.fd, &theirs, sizeof theirs), "B's qp info");
  CHECK(SendAll(l.fd, &mine, sizeof mine), "send qp info");
  const char* err = ConnectQp(qp, pa.active_mtu, gid_index, mine, theirs);
  CHECK(err == nullptr, "%s", err);
  char ready = 0;
  CHECK(RecvAll(l.fd, &ready, 1) && ready == 'R', "B not ready");
  char gid_s[INET6_ADDRSTRLEN] = "?", peer_gid_s[INET6_ADDRSTRLEN] = "?";
  inet_ntop(AF_INET6, mine.gid, gid_s, sizeof gid_s);
  inet_ntop(AF_INET6, theirs.gid, peer_gid_s, sizeof peer_gid_s);
  printf("A: RC QP %u connected from GID %s (index %d) to B's QP %u at GID %s, mtu %d\n",
         qp->qp_num, gid_s, gid_index, theirs.qp_num, peer_gid_s, 128 << pa.active_mtu);
  return l;
}

// B READs pattern seed_a from [p, p+n) and WRITEs seed_b over it.
Reply Cycle(const Link& l, void* p, size_t n, uint32_t rkey, uint64_t seed_a, uint64_t seed_b) {
  Request rq{kCycle, rkey, reinterpret_cast<uintptr_t>(p), n, seed_a, seed_b};
  CHECK(SendAll(l.fd, &rq, sizeof rq), "send request");
  Reply rp;
  CHECK(RecvAll(l.fd, &rp, sizeof rp), "no reply from B");
  return rp;
}

const size_t kSizes[] = {4096, 100, 65536, kMiB + 8, 777, 256 * 1024, 2 * kMiB, 8, 3000, 512 * 1024};

int Run(bool expect_served, int cycles, bool after_free, int listen_port) {
  Link l = Connect(listen_port);
  const int warmup = 10;
  int kernel_regs = 0, kernel_regs_after_warmup = 0;
  size_t read_bad = 0, cpu_bad = 0;
  for (int c = 0; c < cycles; c++) {
    size_t n = kSizes[c % (sizeof kSizes / sizeof kSizes[0])];
    void* p = malloc(n);
    CHECK(p != nullptr, "malloc(%zu)", n);
    uint64_t seed_a = 100 + 2 * c, seed_b = 101 + 2 * c;
    FillWords(p, 0, n, seed_a);
    long pin0 = StatusKb("VmPin");
    ibv_mr* mr = ibv_reg_mr(l.pd, p, n, kAccess);
    long pin1 = StatusKb("VmPin");
    CHECK(mr != nullptr, "ibv_reg_mr(%p, %zu) in cycle %d", p, n, c);
    CHECK(mr->addr == p && mr->length == n && mr->pd == l.pd, "the MR describes another range");
    bool kernel = pin1 > pin0;
    kernel_regs += kernel;
    if (c >= warmup) kernel_regs_after_warmup += kernel;
    Reply rp = Cycle(l, p, n, mr->rkey, seed_a, seed_b);
    CHECK(rp.status == 0, "B's verbs error %d in cycle %d", rp.status, c);
    size_t bad = WordMismatches(p, 0, n, seed_b);
    read_bad += rp.read_mismatches;
    cpu_bad += bad;
    if (c < 3 || rp.read_mismatches != 0 || bad != 0 || kernel)
      printf("cycle %2d: %8zu bytes at %p lkey 0x%08x rkey 0x%08x, VmPin %ld -> %ld kB%s; "
             "B's READ mismatches %llu, CPU mismatches after B's WRITE %zu\n",
             c, n, p, mr->lkey, mr->rkey, pin0, pin1, kernel ? " (kernel registration)" : "",
             static_cast<unsigned long long>(rp.read_mismatches), bad);
    CHECK(ibv_dereg_mr(mr) == 0, "ibv_dereg_mr in cycle %d", c);
    free(p);
  }
  printf("%d cycles: %d kernel registrations (%d after %d warm-up cycles); READ mismatches %zu, "
         "CPU mismatches %zu\n",
         cycles, kernel_regs, kernel_regs_after_warmup, warmup, read_bad, cpu_bad);
  CHECK(read_bad == 0 && cpu_bad == 0, "the NIC and the CPU saw different bytes");
  if (expect_served) {
    CHECK(kernel_regs_after_warmup == 0, "%d heap buffers registered in the kernel after warm-up",
          kernel_regs_after_warmup);
  } else {
    CHECK(kernel_regs == cycles, "only %d of %d registrations reached the kernel (the count "
          "cannot see them, or they were served without the rights)", kernel_regs, cycles);
  }

  if (after_free) {
    // An MR on memory the program freed: churn until jemalloc gives the
    // region back (RDMALLOC_DECAY_MS=0: at once), then compare.
    const size_t n = 4 * kMiB;
    char* x = static_cast<char*>(malloc(n));
    FillWords(x, 0, n, 7000);
    ibv_mr* mr = ibv_reg_mr(l.pd, x, n, kAccess);
    CHECK(mr != nullptr, "ibv_reg_mr of the buffer to free");
    // Touching freed memory is the point here: the MR still holds its pages.
    char* block = x;
    x = rdmalloc_test::AddressOnly(block);
    free(block);
    for (int i = 0; i < 200; i++) {
      void* junk[8];
      for (auto& j : junk) j = malloc((i % 7 + 1) * kMiB);
      for (auto& j : junk) free(j);
    }
    // The pages are still mapped (the MR holds the region): the CPU writes a
    // pattern, the NIC must read that very pattern, and B's WRITE must show.
    FillWords(x, 0, n, 7001);
    Reply rp = Cycle(l, x, n, mr->rkey, 7001, 7002);
    CHECK(rp.status == 0, "B's verbs error %d after free", rp.status);
    size_t bad = WordMismatches(x, 0, n, 7002);
    printf("after free: %zu bytes, MR held through 200 churn rounds: B's READ mismatches %llu, "
           "CPU mismatches after B's WRITE %zu\n",
           n, static_cast<unsigned long long>(rp.read_mismatches), bad);
    CHECK(rp.read_mismatches == 0 && bad == 0, "the NIC and the CPU see different pages");
    CHECK(ibv_dereg_mr(mr) == 0, "ibv_dereg_mr after free");
  }

  Request bye{kBye, 0, 0, 0, 0, 0};
  CHECK(SendAll(l.fd, &bye, sizeof bye), "bye");
  if (l.peer > 0) {
    bool exited = false;
    int status = WaitBounded(l.peer, 30, &exited);
    CHECK(exited && WIFEXITED(status) && WEXITSTATUS(status) == 0, "B status %d", status);
  } else {
    // B in the other VM: its exit status is its launcher's to check; here, it
    // must have closed the connection (done with its QP) before A tears down.
    char c;
    CHECK(recv(l.fd, &c, 1, 0) == 0, "B did not close the connection after bye");
  }
  // A program cleans up: with every MR of its own gone the pd must go too,
  // though rdmalloc registered the heap on it.
  CHECK(ibv_destroy_qp(l.qp) == 0, "ibv_destroy_qp");
  CHECK(ibv_destroy_cq(l.cq) == 0, "ibv_destroy_cq");
  int rc = ibv_dealloc_pd(l.pd);
  CHECK(rc == 0, "ibv_dealloc_pd: %s", strerror(rc));
  CHECK(ibv_close_device(l.ctx) == 0, "ibv_close_device");
  printf("PASS\n");
  return 0;
}

}  // namespace
}  // namespace rdmalloc_test

int main(int argc, char** argv) {
  if (argc == 3 && strcmp(argv[1], "--role=peer") == 0) {
    sockaddr_in a = rdmalloc_test::LoopbackAddr(atoi(argv[2]));
    if (strncmp(argv[2], "--connect=", 10) == 0 && !rdmalloc_test::ParseIpPort(argv[2] + 10, &a)) {
      fprintf(stderr, "usage: %s --role=peer --connect=IP:PORT\n", argv[0]);
      return 2;
    }
    return rdmalloc_test::PeerMain(a);
  }
  int expect = -1, cycles = 60, listen_port = 0;
  bool after_free = false;
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--expect=served") == 0) expect = 1;
    else if (strcmp(argv[i], "--expect=forwarded") == 0) expect = 0;
    else if (strncmp(argv[i], "--cycles=", 9) == 0) cycles = atoi(argv[i] + 9);
    else if (strcmp(argv[i], "--after-free") == 0) after_free = true;
    else if (strncmp(argv[i], "--listen=", 9) == 0 && atoi(argv[i] + 9) > 0) listen_port = atoi(argv[i] + 9);
    else expect = -2;
  }
  if (expect < 0 || cycles < 11 || listen_port > 65535) {
    fprintf(stderr, "usage: %s --expect=served|forwarded [--cycles=N>10] [--after-free] "
            "[--listen=PORT]\n       %s --role=peer --connect=IP:PORT\n", argv[0], argv[0]);
    return 2;
  }
  alarm(900);
  return rdmalloc_test::Run(expect == 1, cycles, after_free, listen_port);
}
