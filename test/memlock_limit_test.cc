// RLIMIT_MEMLOCK as the limit, for a process without CAP_IPC_LOCK (run by
// test/memlock_limit_test.sh under prlimit + setpriv): allocations far beyond
// the limit succeed, lookups past it say "registration failed" with the
// kernel's errno, the stats count them, VmPin never exceeds the limit, and
// freeing registered memory lets a later lookup register.
#include <gtest/gtest.h>
#include <sys/resource.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include "test/page_oracle.h"
#include "test/test_util.h"

namespace rdmalloc_test {
namespace {

constexpr size_t kMiB = size_t{1} << 20;
// The script sets RDMALLOC_REGION_SIZE=2M (the hard limit here may be as low
// as 8 MiB): a buffer of 1.5 MiB then has a 2 MiB region mostly to itself.
constexpr size_t kBuffer = 3 * kMiB / 2;
constexpr int kBuffers = 16;

bool HasCapIpcLock() {
  FILE* f = fopen("/proc/self/status", "r");
  if (f == nullptr) return true;
  char line[256];
  unsigned long long eff = ~0ull;
  while (fgets(line, sizeof line, f) != nullptr) {
    if (sscanf(line, "CapEff: %llx", &eff) == 1) break;
  }
  fclose(f);
  return (eff >> 14) & 1;  // CAP_IPC_LOCK
}

TEST(MemlockLimit, AllocationsBeyondTheLimitSucceedLookupsFailThenRetry) {
  rlimit lim;
  ASSERT_EQ(getrlimit(RLIMIT_MEMLOCK, &lim), 0);
  ASSERT_NE(lim.rlim_cur, RLIM_INFINITY) << "run through memlock_limit_test.sh";
  ASSERT_FALSE(HasCapIpcLock()) << "run through memlock_limit_test.sh (drops CAP_IPC_LOCK)";
  const size_t limit = lim.rlim_cur;
  const long limit_kb = static_cast<long>(limit >> 10);
  ASSERT_LT(limit, kBuffers * kBuffer / 2) << "the test allocates at least twice the limit";
  printf("uid %d, RLIMIT_MEMLOCK %zu MiB, backend %s, registration %s\n", getuid(), limit >> 20,
         rdmalloc_backend(), getenv("RDMALLOC_REGISTER") ? getenv("RDMALLOC_REGISTER") : "lazy");
  ASSERT_STREQ(rdmalloc_backend(), "uring");
  ASSERT_STREQ(getenv("RDMALLOC_REGION_SIZE"), "2M");

  struct rdmalloc_stats s0 = Stats();
  std::vector<uint8_t*> bufs;
  for (int i = 0; i < kBuffers; i++) {
    auto* p = static_cast<uint8_t*>(malloc(kBuffer));
    ASSERT_NE(p, nullptr) << "allocation " << i << " (" << (i + 1) * (kBuffer >> 10) << " KiB)";
    memset(p, i + 1, kBuffer);
    bufs.push_back(p);
  }
  std::vector<bool> registered(kBuffers, false);
  int ok = 0, failed = 0, reg_errno = 0;
  long max_pin_kb = 0;
  for (int i = 0; i < kBuffers; i++) {
    rdmalloc_keys k;
    errno = 0;
    int rc = rdmalloc_lookup(bufs[i], kBuffer, nullptr, &k);
    if (rc == RDMALLOC_OK) {
      registered[i] = true;
      ok++;
    } else {
      EXPECT_EQ(rc, RDMALLOC_EREGFAIL) << "buffer " << i;
      EXPECT_TRUE(k.reg_errno == ENOMEM || k.reg_errno == EAGAIN) << "reg_errno " << k.reg_errno;
      EXPECT_EQ(errno, k.reg_errno);
      reg_errno = k.reg_errno;
      failed++;
    }
    max_pin_kb = std::max(max_pin_kb, VmPinKb());
    EXPECT_LE(VmPinKb(), limit_kb) << "after lookup " << i;
  }
  struct rdmalloc_stats s1 = Stats();
  printf("%d of %d buffers of %zu KiB registered, %d refused (%s); VmPin at most %ld kB of %ld; "
         "registered %llu MiB, %llu registration failures\n",
         ok, kBuffers, kBuffer >> 10, failed, strerror(reg_errno), max_pin_kb, limit_kb,
         (unsigned long long)(s1.bytes_registered >> 20),
         (unsigned long long)(s1.reg_failures - s0.reg_failures));
  // Eager mode registers jemalloc's first regions at start-up, which may take
  // the whole limit; the lazy run must register some.
  const bool eager = getenv("RDMALLOC_REGISTER") != nullptr && strcmp(getenv("RDMALLOC_REGISTER"), "eager") == 0;
  if (!eager) {
    EXPECT_GE(ok, 1);
  }
  EXPECT_GE(failed, kBuffers / 2);
  EXPECT_LE(size_t(ok) * kBuffer, limit);
  EXPECT_LE(s1.bytes_registered, limit);
  EXPECT_EQ(s1.lookup_reg_failed - s0.lookup_reg_failed, uint64_t(failed));
  EXPECT_GE(s1.reg_failures - s0.reg_failures, uint64_t(failed));
  EXPECT_EQ(s1.domain[0].reg_failures, s1.reg_failures);

  // Free the registered buffers: their pins go, so the refused ones register.
  int first_refused = -1;
  for (int i = 0; i < kBuffers; i++) {
    if (registered[i]) {
      free(bufs[i]);
      bufs[i] = nullptr;
    } else if (first_refused < 0) {
      first_refused = i;
    }
  }
  ASSERT_GE(first_refused, 0);
  ForceDecay();
  if (ok == 0) {
    printf("nothing was registered, so nothing to free: retry checked by the lazy run only\n");
    for (uint8_t* p : bufs) free(p);
    ASSERT_TRUE(eager);
    return;
  }
  // The kernel returns the pins when the ring drops its last page
  // reference, which may be a moment after the unregister call: poll.
  rdmalloc_keys k;
  int rc = RDMALLOC_EREGFAIL;
  for (int tries = 0; tries < 200 && rc != RDMALLOC_OK; tries++) {
    rc = rdmalloc_lookup(bufs[first_refused], kBuffer, nullptr, &k);
    if (rc != RDMALLOC_OK) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_EQ(rc, RDMALLOC_OK) << "a refused buffer registers once memory was freed";
  OracleResult r = CheckPageIdentity(bufs[first_refused], kBuffer, kBuffer - 65536, 65536, 3);
  EXPECT_TRUE(r.ok) << r.what;
  EXPECT_LE(VmPinKb(), limit_kb);

  for (uint8_t* p : bufs) free(p);
  ForceDecay();
  struct rdmalloc_stats s2 = Stats();
  long pin = VmPinKbWhen([](long kb, long want) { return kb <= want; },
                         long((s0.bytes_pinned + 2 * kMiB) >> 10));
  printf("after free: registered %llu MiB, pinned %llu MiB, VmPin %ld kB\n",
         (unsigned long long)(s2.bytes_registered >> 20),
         (unsigned long long)(s2.bytes_pinned >> 20), pin);
  // Slack of one region: the last buffer's region may also hold jemalloc
  // metadata (never freed), and the retry registered it.
  EXPECT_LE(s2.bytes_pinned, s0.bytes_pinned + 2 * kMiB);
  EXPECT_LE(pin, long((s0.bytes_pinned + 2 * kMiB) >> 10));
}

}  // namespace
}  // namespace rdmalloc_test
