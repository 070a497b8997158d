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
#include "test/vm/rc_peer.h"

extern char** environ;

namespace rdmalloc_test {
namespace {

// ------------------------------------------------------------------ process A

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
  // B's malloc registers nothing (RDMALLOC_BACKEND=none): B is the remote peer.
  peer.pid = SpawnPeer(port, {"RDMALLOC_BACKEND="}, "RDMALLOC_BACKEND=none");
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
  ibv_gid gid{};
  int gid_index = PickGid(ctx, pa, &gid);
  ASSERT_GE(gid_index, 0) << "no GID on rxe0";
  memcpy(mine.gid, gid.raw, 16);
  ASSERT_TRUE(RecvAll(fd, &theirs, sizeof theirs)) << "B's qp info";
  ASSERT_TRUE(SendAll(fd, &mine, sizeof mine));
  const char* err = ConnectQp(qp, pa.active_mtu, gid_index, mine, theirs);
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
    return rdmalloc_test::PeerMain(rdmalloc_test::LoopbackAddr(atoi(argv[2])));
  testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
