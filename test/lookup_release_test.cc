// A lookup finds keys and registers; it never deregisters or unmaps
// (docs/DESIGN.md, "Lookups"). A region whose last block is freed while a
// lookup holds its lock (the lookup is registering it) is released by the
// release thread, not by the lookup. The backend is wrapped by
// test/fault_injection.h, whose gate holds the lookup's registration open
// while the test frees the block, and which sees each deregistration's thread.
#include <gtest/gtest.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstdlib>
#include <thread>

#include "test/fault_injection.h"
#include "test/test_util.h"

namespace rdmalloc_test {
namespace {

// Before main: the heap opens its backend at the first rdmalloc_* call.
const bool g_installed = (InstallFaultInjection(), true);

constexpr size_t kMiB = size_t{1} << 20;
constexpr size_t kDedicated = 72 * kMiB;  // larger than a shared region: a fresh region of its own

TEST(LookupRelease, ARegionFreedDuringItsLookupIsReleasedByTheReleaseThread) {
  ASSERT_TRUE(g_installed);
  void* warm = malloc(64);
  rdmalloc_keys keys;
  ASSERT_EQ(rdmalloc_lookup(warm, 1, nullptr, &keys), RDMALLOC_OK);
  free(warm);
  ASSERT_TRUE(FaultInjectionActive()) << "the backend did not open through the decorator";

  for (int round = 0; round < 3; round++) {
    SCOPED_TRACE(round);
    char* p = static_cast<char*>(malloc(kDedicated));
    ASSERT_NE(p, nullptr);
    p[0] = 1;
    struct rdmalloc_stats before = Stats();
    uint64_t deregistered = DeregisterCallsSeen();
    HoldNextRegistration();
    long looker = 0;
    int rc = -1;
    std::thread lookup([&] {
      looker = syscall(SYS_gettid);
      rdmalloc_keys k;
      rc = rdmalloc_lookup(p + 4096, 4096, nullptr, &k);
    });
    WaitUntilRegistrationHeld();  // the lookup holds the region's lock
    free(p);  // its last block (RDMALLOC_RETAIN=0): release wanted, lock busy
    OpenHeldRegistration();
    lookup.join();
    // The program freed what it looked up: the keys may be stale, not wrong.
    EXPECT_EQ(rc, RDMALLOC_OK);

    ASSERT_TRUE(WaitUntil([&] { return DeregisterCallsSeen() > deregistered; }))
        << "the region was never deregistered";
    ASSERT_TRUE(WaitForReleases());
    EXPECT_NE(LastDeregisterThread(), looker) << "the lookup deregistered the region itself";
    EXPECT_NE(LastDeregisterThread(), syscall(SYS_gettid)) << "the free deregistered it";
    struct rdmalloc_stats after = Stats();
    EXPECT_EQ(after.releases_deferred - before.releases_deferred, 1u);
    EXPECT_EQ(after.regions_released - before.regions_released, 1u);
    EXPECT_EQ(after.bytes_registered, before.bytes_registered) << "the region stayed registered";
  }
}

}  // namespace
}  // namespace rdmalloc_test
