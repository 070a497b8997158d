// Everything at once: threads allocating, looking up, moving bytes through
// the registration and freeing, while other threads add and remove domains
// and force decay (regions made and released all the time). Any race in the
// registration life cycle shows up as a mismatch, a wrong error, or a crash.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "test/page_oracle.h"
#include "test/test_util.h"

namespace rdmalloc_test {
namespace {

constexpr int kWorkers = 12;
// At least kDuration and enough work to mean something; on a slow or loaded
// machine (sanitizers, other jobs) it runs longer, up to kDeadline.
constexpr auto kDuration = std::chrono::seconds(6);
constexpr auto kDeadline = std::chrono::seconds(120);
constexpr uint64_t kMinChecks = 1000, kMinDomainChanges = 20;

TEST(Stress, AllocLookupDmaWithDomainChurnAndDecay) {
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> ops{0}, checks{0}, failures{0}, domain_changes{0}, decays{0};
  static int tokens[4];
  auto token = [](int i) { return reinterpret_cast<ibv_pd*>(&tokens[i]); };

  auto worker = [&](int id) {
    std::mt19937_64 rng(id);
    std::vector<std::pair<uint8_t*, size_t>> live;
    while (!stop.load(std::memory_order_relaxed)) {
      int what = std::uniform_int_distribution<int>(0, 9)(rng);
      if (what < 4 || live.empty()) {
        // Mostly small; now and then a dedicated region (> 64 MiB).
        size_t n = what == 0 && rng() % 16 == 0
                       ? size_t{68} << 20
                       : size_t{1} << std::uniform_int_distribution<int>(3, 21)(rng);
        auto* p = static_cast<uint8_t*>(malloc(n));
        p[0] = 1;
        p[n - 1] = 2;
        live.emplace_back(p, n);
      } else if (what < 7) {
        size_t i = rng() % live.size();
        free(live[i].first);
        live[i] = live.back();
        live.pop_back();
      } else if (what < 9) {
        auto [p, n] = live[rng() % live.size()];
        size_t m = std::min<size_t>(n, 4096);
        OracleResult r = CheckPageIdentity(p, n, n - m, m, rng());
        checks++;
        if (!r.ok) {
          failures++;
          ADD_FAILURE() << r.what;
        }
      } else {
        // A lookup under a domain that may come and go: OK or "unknown pd".
        auto [p, n] = live[rng() % live.size()];
        rdmalloc_keys k;
        int rc = rdmalloc_lookup(p, n, token(rng() % 4), &k);
        if (rc != RDMALLOC_OK && rc != RDMALLOC_EINVAL) {
          failures++;
          ADD_FAILURE() << "lookup under an added pd returned " << rc;
        }
      }
      ops++;
    }
    for (auto& [p, n] : live) free(p);
  };
  auto domains = [&] {
    std::mt19937_64 rng(99);
    while (!stop.load(std::memory_order_relaxed)) {
      int i = rng() % 4;
      if (rdmalloc_add_pd(token(i), RDMALLOC_ACCESS_LOCAL_WRITE) == RDMALLOC_OK) {
        domain_changes++;
      } else if (rdmalloc_remove_pd(token(i)) == RDMALLOC_OK) {
        domain_changes++;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
  };
  auto decay = [&] {
    while (!stop.load(std::memory_order_relaxed)) {
      mallctl("arena.4096.purge", nullptr, nullptr, nullptr, 0);
      decays++;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  };

  std::vector<std::thread> threads;
  for (int i = 0; i < kWorkers; i++) threads.emplace_back(worker, i);
  threads.emplace_back(domains);
  threads.emplace_back(decay);
  auto start = std::chrono::steady_clock::now();
  for (;;) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    auto elapsed = std::chrono::steady_clock::now() - start;
    bool enough = checks.load() > kMinChecks && domain_changes.load() > kMinDomainChanges;
    if ((elapsed >= kDuration && enough) || elapsed >= kDeadline) break;
  }
  stop = true;
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  for (auto& t : threads) t.join();
  for (int i = 0; i < 4; i++) rdmalloc_remove_pd(token(i));
  ForceDecay();
  struct rdmalloc_stats s = Stats();
  printf("stress: %.1f s, %llu ops, %llu page-identity checks, %llu domain changes, %llu decays, "
         "%llu regions released, %llu reg / %llu dereg, %llu failures\n",
         seconds, (unsigned long long)ops.load(), (unsigned long long)checks.load(),
         (unsigned long long)domain_changes.load(), (unsigned long long)decays.load(),
         (unsigned long long)s.regions_released, (unsigned long long)s.reg_calls,
         (unsigned long long)s.dereg_calls, (unsigned long long)failures.load());
  EXPECT_EQ(failures.load(), 0u);
  EXPECT_GT(checks.load(), kMinChecks);
  EXPECT_GT(domain_changes.load(), kMinDomainChanges);  // each change opens or closes a ring and scans all regions
  EXPECT_GT(s.regions_released, 10u);
  EXPECT_EQ(s.domains, 1u) << "only the default domain is left";
  for (int d = 1; d < RDMALLOC_MAX_DOMAINS; d++) {
    EXPECT_EQ(s.domain[d].bytes_registered, 0u) << "domain slot " << d << " leaked registrations";
  }
  EXPECT_EQ(s.bytes_registered, s.domain[0].bytes_registered);
}

}  // namespace
}  // namespace rdmalloc_test
