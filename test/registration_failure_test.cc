// Registration failures never fail an allocation. The backend is wrapped by
// test/fault_injection.h, which fails Register with a chosen errno on a
// schedule: the malloc family keeps working, lookups say "registration
// failed" with that errno, the stats count it, a later lookup retries and
// gets a real registration, and nothing leaks once everything is freed.
#include <gtest/gtest.h>
#include <malloc.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "test/fault_injection.h"
#include "test/page_oracle.h"
#include "test/test_util.h"

namespace rdmalloc_test {
namespace {

// Before main: the heap opens its backend at the first rdmalloc_* call.
const bool g_installed = (InstallFaultInjection(), true);

constexpr size_t kMiB = size_t{1} << 20;
constexpr size_t kDedicated = 72 * kMiB;  // larger than a shared region: a fresh region of its own

bool KeysCover(const rdmalloc_keys& k, const void* p, size_t n) {
  auto a = reinterpret_cast<uintptr_t>(p), base = reinterpret_cast<uintptr_t>(k.region_base);
  return k.addr == p && k.len == n && base <= a && a + n <= base + k.region_len;
}

// Starts the backend through the decorator (faults cleared) and returns the
// state everything must come back to. A warm-up of the tests' shapes first:
// jemalloc's metadata (never freed) grows to what they need, so that what is
// left afterwards is a leak, not metadata.
struct Baseline {
  struct rdmalloc_stats stats;
  long pin_kb;
};
Baseline TakeBaseline() {
  ClearFaults();
  std::vector<void*> warm;
  for (int i = 0; i < 500; i++) warm.push_back(malloc(size_t{8} << (i % 19)));
  for (int i = 0; i < 4; i++) warm.push_back(malloc(kDedicated + i * kMiB));
  for (void* p : warm) {
    rdmalloc_keys k;
    EXPECT_EQ(rdmalloc_lookup(p, 1, nullptr, &k), RDMALLOC_OK);
  }
  for (void* p : warm) free(p);
  ForceDecay();
  return {Stats(), VmPinKbWhen([](long kb, long want) { return kb <= want; }, 0)};
}

void ExpectBackAtBaseline(const Baseline& b, const char* when) {
  ForceDecay();
  struct rdmalloc_stats s = Stats();
  long pin = VmPinKbWhen([](long kb, long want) { return kb <= want; }, b.pin_kb);
  printf("%s: regions live %llu (baseline %llu), registered %llu B (%llu), pinned %llu B (%llu), "
         "VmPin %ld kB (%ld)\n",
         when, (unsigned long long)s.regions_live, (unsigned long long)b.stats.regions_live,
         (unsigned long long)s.bytes_registered, (unsigned long long)b.stats.bytes_registered,
         (unsigned long long)s.bytes_pinned, (unsigned long long)b.stats.bytes_pinned, pin, b.pin_kb);
  // At most: the baseline itself may still hold a region jemalloc had not
  // given back yet.
  EXPECT_LE(s.regions_live, b.stats.regions_live) << when;
  EXPECT_LE(s.bytes_registered, b.stats.bytes_registered) << when;
  EXPECT_LE(s.bytes_pinned, b.stats.bytes_pinned) << when;
  EXPECT_LE(s.bytes_mapped, b.stats.bytes_mapped) << when;
  EXPECT_LE(pin, b.pin_kb) << when;
}

// One lookup expected to fail with `err`: return code, keys.reg_errno, errno.
void ExpectRegFail(void* p, size_t n, int err) {
  rdmalloc_keys k;
  memset(&k, 0xff, sizeof k);
  errno = 0;
  EXPECT_EQ(rdmalloc_lookup(p, n, nullptr, &k), RDMALLOC_EREGFAIL) << "size " << n;
  EXPECT_EQ(k.reg_errno, err);
  EXPECT_EQ(errno, err);
}

TEST(FaultInjection, AllocationsSucceedLookupsFailWithTheErrnoThenRetry) {
  ASSERT_TRUE(g_installed);
  Baseline base = TakeBaseline();
  ASSERT_TRUE(FaultInjectionActive()) << "the heap did not take the decorator";

  FailAllRegistrations(ENOMEM);
  uint64_t injected0 = RegistrationsFailed();
  // Every allocation function, each into a fresh region (nothing in it can be
  // registered already), while every registration fails.
  struct Buf {
    uint8_t* p;
    size_t n;
  };
  std::vector<Buf> fresh;
  fresh.push_back({static_cast<uint8_t*>(malloc(kDedicated)), kDedicated});
  fresh.push_back({static_cast<uint8_t*>(calloc(1, kDedicated + kMiB)), kDedicated + kMiB});
  void* grown = malloc(100);
  ASSERT_NE(grown, nullptr);
  memset(grown, 7, 100);
  grown = realloc(grown, kDedicated + 2 * kMiB);
  ASSERT_NE(grown, nullptr);
  EXPECT_TRUE(std::all_of(static_cast<uint8_t*>(grown), static_cast<uint8_t*>(grown) + 100,
                          [](uint8_t v) { return v == 7; }));
  fresh.push_back({static_cast<uint8_t*>(grown), kDedicated + 2 * kMiB});
  void* aligned = nullptr;
  ASSERT_EQ(posix_memalign(&aligned, 2 * kMiB, kDedicated + 3 * kMiB), 0);
  fresh.push_back({static_cast<uint8_t*>(aligned), kDedicated + 3 * kMiB});
  for (Buf& b : fresh) {
    ASSERT_NE(b.p, nullptr);
    memset(b.p + b.n - 4096, 0x5a, 4096);  // the memory is there, registered or not
  }
  EXPECT_EQ(fresh[1].p[12345], 0) << "calloc";

  // Small and medium allocations of every kind, sharing regions: some land in
  // a region registered before the faults began (OK), the rest fail.
  std::vector<Buf> shared;
  std::mt19937_64 rng(11);
  for (int i = 0; i < 400; i++) {
    size_t n = size_t{8} << (rng() % 19);  // 8 B .. 2 MiB
    void* p = nullptr;
    switch (i % 4) {
      case 0: p = malloc(n); break;
      case 1: p = calloc(1, n); break;
      case 2: p = realloc(malloc(8), n); break;
      case 3: EXPECT_EQ(posix_memalign(&p, 64, n), 0); break;
    }
    ASSERT_NE(p, nullptr) << "allocation " << i << " of " << n << " bytes";
    memset(p, i, n);
    shared.push_back({static_cast<uint8_t*>(p), n});
  }

  struct rdmalloc_stats s0 = Stats();
  for (Buf& b : fresh) ExpectRegFail(b.p, b.n, ENOMEM);
  uint64_t shared_failed = 0;
  for (Buf& b : shared) {
    rdmalloc_keys k;
    errno = 0;
    int rc = rdmalloc_lookup(b.p, b.n, nullptr, &k);
    if (rc == RDMALLOC_OK) {
      EXPECT_TRUE(KeysCover(k, b.p, b.n));
      continue;
    }
    ASSERT_EQ(rc, RDMALLOC_EREGFAIL);
    EXPECT_EQ(k.reg_errno, ENOMEM);
    EXPECT_EQ(errno, ENOMEM);
    shared_failed++;
  }
  struct rdmalloc_stats s1 = Stats();
  uint64_t failed_lookups = fresh.size() + shared_failed;
  uint64_t injected = RegistrationsFailed() - injected0;
  printf("while failing: %zu fresh + %llu shared lookups failed, %llu registrations refused\n",
         fresh.size(), (unsigned long long)shared_failed, (unsigned long long)injected);
  // Every failed lookup tried to register once (no cap is set): the heap
  // counted each refusal, per domain too.
  EXPECT_EQ(s1.lookup_reg_failed - s0.lookup_reg_failed, failed_lookups);
  EXPECT_EQ(s1.reg_failures - s0.reg_failures, failed_lookups);
  EXPECT_EQ(s1.domain[0].reg_failures - s0.domain[0].reg_failures, failed_lookups);
  EXPECT_EQ(s1.cap_hits, s0.cap_hits);
  EXPECT_GE(injected, failed_lookups);
  EXPECT_EQ(s1.bytes_registered, s0.bytes_registered) << "a failed registration counts nothing";

  // Each lookup of a failed region tries again; the errno is the backend's
  // latest one.
  FailAllRegistrations(EFAULT);
  uint64_t calls = RegisterCallsSeen();
  ExpectRegFail(fresh[0].p, fresh[0].n, EFAULT);
  ExpectRegFail(fresh[0].p, fresh[0].n, EFAULT);
  EXPECT_EQ(RegisterCallsSeen() - calls, 2u) << "a failed region is registered again on lookup";

  // One more failure, then the backend has room again.
  FailNextRegistrations(1, EAGAIN);
  ExpectRegFail(fresh[0].p, fresh[0].n, EAGAIN);
  rdmalloc_keys k;
  ASSERT_EQ(rdmalloc_lookup(fresh[0].p, fresh[0].n, nullptr, &k), RDMALLOC_OK);
  EXPECT_TRUE(KeysCover(k, fresh[0].p, fresh[0].n));
  EXPECT_TRUE(CheckPageIdentity(fresh[0].p, fresh[0].n, fresh[0].n - 8192, 8192, 1).ok)
      << "the retried registration is real";

  // Every other registration fails: each buffer registers within two lookups.
  FailEveryKthRegistration(2, EIO);
  for (size_t i = 1; i < fresh.size(); i++) {
    int tries = 0, rc;
    do {
      errno = 0;
      rc = rdmalloc_lookup(fresh[i].p, fresh[i].n, nullptr, &k);
      tries++;
      if (rc != RDMALLOC_OK) {
        EXPECT_EQ(rc, RDMALLOC_EREGFAIL);
        EXPECT_EQ(k.reg_errno, EIO);
        EXPECT_EQ(errno, EIO);
      }
    } while (rc != RDMALLOC_OK && tries < 2);
    EXPECT_EQ(rc, RDMALLOC_OK) << "buffer " << i << " after " << tries << " lookups";
  }

  // Faults cleared: every buffer resolves and its bytes move both ways.
  ClearFaults();
  for (Buf& b : fresh) {
    ASSERT_EQ(rdmalloc_lookup(b.p, b.n, nullptr, &k), RDMALLOC_OK);
    EXPECT_TRUE(KeysCover(k, b.p, b.n));
    OracleResult r = CheckPageIdentity(b.p, b.n, 0, 16384, b.n);
    EXPECT_TRUE(r.ok) << r.what;
  }
  for (size_t i = 0; i < shared.size(); i += 7) {
    Buf& b = shared[i];
    OracleResult r = CheckPageIdentity(b.p, b.n, 0, std::min<size_t>(b.n, 4096), i);
    EXPECT_TRUE(r.ok) << r.what << " on a " << b.n << "-byte buffer";
  }
  struct rdmalloc_stats s2 = Stats();
  EXPECT_GE(s2.bytes_registered - s0.bytes_registered, fresh.size() * kDedicated);

  for (Buf& b : fresh) free(b.p);
  for (Buf& b : shared) free(b.p);
  ExpectBackAtBaseline(base, "after free");
  for (Buf& b : fresh)
    EXPECT_EQ(rdmalloc_lookup(b.p, 1, nullptr, &k), RDMALLOC_ENOTOURS) << "region not released";
}

// A region whose registration failed and that is then freed is released
// like any other: no registration, no pin, no mapping left.
TEST(FaultInjection, FreeingAFailedRegionReleasesIt) {
  Baseline base = TakeBaseline();
  ASSERT_TRUE(FaultInjectionActive());
  struct rdmalloc_stats s0 = Stats();
  FailAllRegistrations(EFAULT);
  for (int i = 0; i < 8; i++) {
    void* p = malloc(kDedicated);
    ASSERT_NE(p, nullptr);
    memset(p, i, kDedicated);
    ExpectRegFail(p, kDedicated, EFAULT);
    free(p);
  }
  ClearFaults();
  ExpectBackAtBaseline(base, "failed regions freed");
  // Every region made for them is gone (a freed one may first have been kept
  // within RDMALLOC_RETAIN and reused by the next block).
  struct rdmalloc_stats s1 = Stats();
  EXPECT_GE(s1.regions_created - s0.regions_created, 1u);
  EXPECT_EQ(s1.regions_released - s0.regions_released, s1.regions_created - s0.regions_created);
}

// Threads look up while a third of all registrations fail: each lookup is
// either keys that cover the buffer and move bytes, or "registration failed"
// with the injected errno; every refusal is counted once.
TEST(FaultInjection, ConcurrentLookupsUnderIntermittentFailures) {
  Baseline base = TakeBaseline();
  ASSERT_TRUE(FaultInjectionActive());
  struct rdmalloc_stats s0 = Stats();
  uint64_t injected0 = RegistrationsFailed();
  FailEveryKthRegistration(3, ENOMEM);
  constexpr int kThreads = 8;
  std::atomic<uint64_t> ok{0}, failed{0}, wrong{0}, unresolved{0};
  auto worker = [&](int id) {
    std::mt19937_64 rng(100 + id);
    for (int i = 0; i < 60; i++) {
      // Mostly shared regions, now and then a fresh dedicated one.
      size_t n = i % 10 == 0 ? kDedicated : size_t{8} << (rng() % 20);
      auto* p = static_cast<uint8_t*>(malloc(n));
      if (p == nullptr) {
        wrong++;
        continue;
      }
      p[0] = 1;
      p[n - 1] = 2;
      int rc = RDMALLOC_EREGFAIL;
      for (int tries = 0; tries < 20 && rc != RDMALLOC_OK; tries++) {
        rdmalloc_keys k;
        errno = 0;
        rc = rdmalloc_lookup(p, n, nullptr, &k);
        if (rc == RDMALLOC_OK) {
          ok++;
          if (!KeysCover(k, p, n) || !CheckPageIdentity(p, n, n - std::min<size_t>(n, 512),
                                                        std::min<size_t>(n, 512), rng())
                                           .ok)
            wrong++;
        } else if (rc == RDMALLOC_EREGFAIL && k.reg_errno == ENOMEM && errno == ENOMEM) {
          failed++;
        } else {
          wrong++;
        }
      }
      if (rc != RDMALLOC_OK) unresolved++;
      free(p);
    }
  };
  std::vector<std::thread> threads;
  for (int i = 0; i < kThreads; i++) threads.emplace_back(worker, i);
  for (auto& t : threads) t.join();
  ClearFaults();
  struct rdmalloc_stats s1 = Stats();
  uint64_t injected = RegistrationsFailed() - injected0;
  printf("threads: %llu lookups ok, %llu failed as injected (%llu refusals), %llu wrong, "
         "%llu unresolved\n",
         (unsigned long long)ok.load(), (unsigned long long)failed.load(),
         (unsigned long long)injected, (unsigned long long)wrong.load(),
         (unsigned long long)unresolved.load());
  EXPECT_EQ(wrong.load(), 0u);
  EXPECT_EQ(unresolved.load(), 0u);
  EXPECT_GT(failed.load(), 0u);
  EXPECT_EQ(s1.lookup_reg_failed - s0.lookup_reg_failed, failed.load());
  EXPECT_EQ(s1.reg_failures - s0.reg_failures, injected);
  ExpectBackAtBaseline(base, "after threads");
}

}  // namespace
}  // namespace rdmalloc_test
