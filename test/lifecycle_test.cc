// The registration life cycle: regions stay registered while jemalloc keeps
// any of them, are deregistered and unmapped once all of it comes back, and
// domains and fork behave.
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include "test/page_oracle.h"
#include "test/test_util.h"

// Every mincore call of the process, counted: rdmalloc is linked into this
// test, so its calls land here rather than in libc.
std::atomic<long> g_mincore_calls{0};
extern "C" int mincore(void* addr, size_t length, unsigned char* vec) {
  g_mincore_calls.fetch_add(1, std::memory_order_relaxed);
  return static_cast<int>(syscall(SYS_mincore, addr, length, vec));
}

namespace rdmalloc_test {
namespace {

constexpr long kMiB = 1024;  // in kB

// Bytes resident of the whole pages inside [p, p + n).
size_t ResidentBytes(const void* p, size_t n) {
  const uintptr_t page = 4096;
  uintptr_t first = (reinterpret_cast<uintptr_t>(p) + page - 1) & ~(page - 1);
  uintptr_t end = (reinterpret_cast<uintptr_t>(p) + n) & ~(page - 1);
  if (end <= first) return 0;
  std::vector<unsigned char> vec((end - first) / page);
  if (mincore(reinterpret_cast<void*>(first), end - first, vec.data()) != 0) return SIZE_MAX;
  size_t resident = 0;
  for (unsigned char v : vec) resident += v & 1;
  return resident * page;
}

// One block past the thread cache, allocated and freed: an allocation tick
// for jemalloc's decay, and an extent through the hooks when decay is 0.
void AllocateAndFreeALargeBlock() {
  void* q = malloc(size_t{64} << 10);
  asm volatile("" : : "r"(q) : "memory");
  free(q);
}

// The size of the largest extent in jemalloc's dirty caches (all arenas),
// to within its page size class: jemalloc counts them per class, and the
// average of the largest class that holds any is in that class. 0 if none.
size_t LargestDirtyExtent() {
  uint64_t epoch = 1;
  if (mallctl("epoch", nullptr, nullptr, &epoch, sizeof epoch) != 0) return SIZE_MAX;
  size_t largest = 0;
  for (unsigned j = 0;; j++) {
    char name[64];
    size_t count = 0, bytes = 0, len = sizeof count;
    snprintf(name, sizeof name, "stats.arenas.4096.extents.%u.ndirty", j);
    if (mallctl(name, &count, &len, nullptr, 0) != 0) break;  // past the last class
    snprintf(name, sizeof name, "stats.arenas.4096.extents.%u.dirty_bytes", j);
    if (mallctl(name, &bytes, &len, nullptr, 0) != 0) return SIZE_MAX;
    if (count != 0) largest = bytes / count;
  }
  return largest;
}

TEST(Lifecycle, ReleasedRegionsAreDeregisteredAndUnpinned) {
  ForceDecay();
  long pin0 = VmPinKb();
  struct rdmalloc_stats s0 = Stats();
  std::vector<void*> bufs;
  for (int i = 0; i < 16; i++) {
    void* p = malloc(size_t{8} << 20);
    memset(p, i, size_t{8} << 20);
    rdmalloc_keys k;
    ASSERT_EQ(rdmalloc_lookup(p, size_t{8} << 20, nullptr, &k), RDMALLOC_OK);
    bufs.push_back(p);
  }
  struct rdmalloc_stats s1 = Stats();
  long pin1 = VmPinKb();
  EXPECT_GE(s1.bytes_registered - s0.bytes_registered, uint64_t{128} << 20);
  EXPECT_GE(pin1 - pin0, 128 * kMiB);
  for (void* p : bufs) free(p);
  ForceDecay();
  struct rdmalloc_stats s2 = Stats();
  long pin2 = VmPinKbWhen([](long kb, long want) { return kb <= want; }, pin0 + 16 * kMiB);
  printf("VmPin %ld -> %ld -> %ld kB; registered %llu -> %llu -> %llu MiB; released %llu regions\n",
         pin0, pin1, pin2, (unsigned long long)(s0.bytes_registered >> 20),
         (unsigned long long)(s1.bytes_registered >> 20),
         (unsigned long long)(s2.bytes_registered >> 20),
         (unsigned long long)(s2.regions_released - s1.regions_released));
  EXPECT_GT(s2.regions_released, s1.regions_released);
  EXPECT_GT(s2.dereg_calls, s1.dereg_calls);
  EXPECT_LE(s2.bytes_registered, s0.bytes_registered + (uint64_t{16} << 20));
  EXPECT_LE(pin2, pin0 + 16 * kMiB);

  // Reuse after release: new memory, registered again, page identity holds.
  void* p = malloc(size_t{8} << 20);
  rdmalloc_keys k;
  ASSERT_EQ(rdmalloc_lookup(p, size_t{8} << 20, nullptr, &k), RDMALLOC_OK);
  EXPECT_GE(Stats().bytes_registered, k.region_len);
  EXPECT_GE(VmPinKb(), static_cast<long>(k.region_len >> 10));
  EXPECT_TRUE(CheckPageIdentity(p, size_t{8} << 20, 0, size_t{8} << 20, 99).ok);
  free(p);
}

TEST(Lifecycle, PartlyUsedRegionStaysWholeAndRegistered) {
  std::vector<void*> bufs;
  for (int i = 0; i < 8; i++) bufs.push_back(malloc(256 << 10));
  rdmalloc_keys first;
  ASSERT_EQ(rdmalloc_lookup(bufs[0], 256 << 10, nullptr, &first), RDMALLOC_OK);
  uint64_t released = Stats().regions_released;
  for (size_t i = 1; i < bufs.size(); i++) free(bufs[i]);
  ForceDecay();
  rdmalloc_keys again;
  ASSERT_EQ(rdmalloc_lookup(bufs[0], 256 << 10, nullptr, &again), RDMALLOC_OK);
  EXPECT_EQ(again.region_base, first.region_base);
  EXPECT_EQ(again.lkey, first.lkey);
  // The old keys still move bytes: the registration was never dropped.
  std::vector<uint8_t> pattern(256 << 10);
  FillPattern(pattern.data(), pattern.size(), 5);
  ASSERT_EQ(rdmalloc_dma_write(&first, 0, pattern.data(), pattern.size()), RDMALLOC_OK);
  EXPECT_EQ(memcmp(bufs[0], pattern.data(), pattern.size()), 0);
  EXPECT_TRUE(CheckPageIdentity(bufs[0], 256 << 10, 0, 256 << 10, 6).ok);
  (void)released;
  free(bufs[0]);
}

TEST(Lifecycle, CallocOfReusedRegisteredMemoryIsZero) {
  const size_t n = size_t{3} << 20;
  for (int round = 0; round < 4; round++) {
    auto* p = static_cast<uint8_t*>(malloc(n));
    rdmalloc_keys k;
    ASSERT_EQ(rdmalloc_lookup(p, n, nullptr, &k), RDMALLOC_OK);
    memset(p, 0xAB, n);
    free(p);
    if (round % 2) ForceDecay();  // reused from jemalloc's cache, then from ours
    auto* q = static_cast<uint8_t*>(calloc(1, n));
    ASSERT_TRUE(std::all_of(q, q + n, [](uint8_t v) { return v == 0; })) << "round " << round;
    std::vector<uint8_t> nic(n, 1);
    ASSERT_EQ(rdmalloc_lookup(q, n, nullptr, &k), RDMALLOC_OK);
    ASSERT_EQ(rdmalloc_dma_read(&k, 0, nic.data(), n), RDMALLOC_OK);
    EXPECT_TRUE(std::all_of(nic.begin(), nic.end(), [](uint8_t v) { return v == 0; }));
    free(q);
  }
}

// An io_uring buffer holds at most 1 GiB: a larger region takes consecutive
// slots, keys advance by one per GiB, and a transfer may cross the boundary.
TEST(Lifecycle, RegionLargerThanOneIoUringBuffer) {
  const size_t gib = size_t{1} << 30, n = gib + (gib >> 2);
  auto* p = static_cast<uint8_t*>(malloc(n));
  ASSERT_NE(p, nullptr);
  rdmalloc_keys low, high;
  ASSERT_EQ(rdmalloc_lookup(p, 4096, nullptr, &low), RDMALLOC_OK);
  size_t into_second = reinterpret_cast<uintptr_t>(low.region_base) + gib - reinterpret_cast<uintptr_t>(p);
  ASSERT_EQ(rdmalloc_lookup(p + into_second, 4096, nullptr, &high), RDMALLOC_OK);
  EXPECT_EQ(high.lkey, low.lkey + 1);
  EXPECT_EQ(high.rkey, low.rkey + 1);
  EXPECT_EQ(high.handle, low.handle);
  EXPECT_EQ(high.access, low.access);
  EXPECT_EQ(high.region_base, low.region_base);
  EXPECT_EQ(high.region_len, low.region_len);
  EXPECT_GE(low.region_len, n);
  // 1 MiB straddling the two buffers, both directions.
  EXPECT_TRUE(CheckPageIdentity(p, n, into_second - (512 << 10), 1 << 20, 41).ok);
  free(p);
  ForceDecay();
}

// An unregistered region gives freed pages back to the OS, as jemalloc
// would: programs that never send a buffer keep jemalloc's footprint.
TEST(Lifecycle, FreedPagesOfAnUnregisteredRegionAreReturned) {
  auto rss_kb = [] {
    FILE* f = fopen("/proc/self/statm", "r");
    long pages = 0, resident = 0;
    if (f != nullptr && fscanf(f, "%ld %ld", &pages, &resident) != 2) resident = -1;
    if (f != nullptr) fclose(f);
    return resident * 4;
  };
  ForceDecay();
  // Medium buffers that share regions (each smaller than a region) and are
  // never looked up.
  std::vector<void*> bufs;
  for (int i = 0; i < 24; i++) {
    void* b = malloc(size_t{5} << 20);
    memset(b, 1, size_t{5} << 20);
    bufs.push_back(b);
  }
  long full = rss_kb();
  void* keep = malloc(64);  // keeps at least one region partly used
  for (void* b : bufs) free(b);
  ForceDecay();
  long after = rss_kb();
  printf("RSS %ld kB with 120 MiB live, %ld kB after free + decay\n", full, after);
  EXPECT_LT(after, full - 100 * kMiB);
  free(keep);
}

// On the uring backend a "pd" is a token with its own pinning ring.
TEST(Domains, AddMakesTheExistingHeapAvailableRemoveDeregisters) {
  void* p = malloc(size_t{4} << 20);
  rdmalloc_keys k0;
  ASSERT_EQ(rdmalloc_lookup(p, size_t{4} << 20, nullptr, &k0), RDMALLOC_OK);
  long pin_before = VmPinKb();
  static int token;
  auto* pd = reinterpret_cast<ibv_pd*>(&token);
  // Remote read: the check below reads through the new domain as a peer would.
  ASSERT_EQ(rdmalloc_add_pd(pd, RDMALLOC_ACCESS_LOCAL_WRITE | RDMALLOC_ACCESS_REMOTE_READ),
            RDMALLOC_OK);
  EXPECT_EQ(rdmalloc_add_pd(pd, RDMALLOC_ACCESS_LOCAL_WRITE), RDMALLOC_EINVAL) << "twice";
  rdmalloc_keys k1;
  ASSERT_EQ(rdmalloc_lookup(p, size_t{4} << 20, pd, &k1), RDMALLOC_OK);
  EXPECT_NE(k1.handle, k0.handle) << "a second ring";
  EXPECT_EQ(k1.region_base, k0.region_base);
  EXPECT_GE(VmPinKb() - pin_before, static_cast<long>(k1.region_len >> 10));
  // The same bytes under both domains.
  EXPECT_TRUE(CheckPageIdentity(p, size_t{4} << 20, 0, 1 << 20, 3).ok);
  std::vector<uint8_t> via_pd(1 << 20);
  ASSERT_EQ(rdmalloc_dma_read(&k1, 0, via_pd.data(), via_pd.size()), RDMALLOC_OK);
  EXPECT_EQ(memcmp(via_pd.data(), p, via_pd.size()), 0);
  struct rdmalloc_stats two = Stats();
  EXPECT_EQ(two.domains, 2u);
  int slot = -1;
  for (int d = 1; d < RDMALLOC_MAX_DOMAINS; d++) slot = two.domain[d].pd == pd ? d : slot;
  ASSERT_GT(slot, 0) << "the pd has its own line in the stats";
  EXPECT_EQ(two.domain[slot].open, 1u);
  EXPECT_GE(two.domain[slot].bytes_registered, k1.region_len);
  EXPECT_GE(two.domain[slot].reg_calls, 1u);
  // Registered twice (once per domain), pinned once.
  EXPECT_GE(two.bytes_registered, two.bytes_pinned + k1.region_len);

  ASSERT_EQ(rdmalloc_remove_pd(pd), RDMALLOC_OK);
  EXPECT_EQ(rdmalloc_lookup(p, 100, pd, &k1), RDMALLOC_EINVAL);
  EXPECT_EQ(Stats().domains, 1u);
  long pin_after = VmPinKbWhen([](long kb, long want) { return kb <= want; }, pin_before);
  EXPECT_LE(pin_after, pin_before);
  EXPECT_EQ(rdmalloc_lookup(p, 100, nullptr, &k0), RDMALLOC_OK) << "the default domain stays";
  free(p);
}

TEST(Fork, ChildUsesItsHeapParentKeysStayValid) {
  const size_t n = size_t{2} << 20;
  auto* p = static_cast<uint8_t*>(malloc(n));
  FillPattern(p, n, 21);
  rdmalloc_keys k;
  ASSERT_EQ(rdmalloc_lookup(p, n, nullptr, &k), RDMALLOC_OK);
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    bool ok = HasPattern(p, n, 21);
    std::vector<void*> v;
    for (int i = 0; i < 1000; i++) v.push_back(malloc(64 + i * 100));
    for (void* q : v) free(q);
    // The child registers in its own ring, for old and new buffers alike.
    ok = ok && CheckPageIdentity(p, n, 0, 4096, 22).ok;
    void* fresh = malloc(n);
    ok = ok && CheckPageIdentity(fresh, n, 0, n, 23).ok;
    free(fresh);
    _exit(ok ? 0 : 1);
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
  EXPECT_TRUE(HasPattern(p, n, 21)) << "the child's writes stayed in the child";
  std::vector<uint8_t> nic(n);
  ASSERT_EQ(rdmalloc_dma_read(&k, 0, nic.data(), n), RDMALLOC_OK) << "parent keys after fork";
  EXPECT_TRUE(HasPattern(nic.data(), n, 21));
  free(p);
}

// RDMALLOC_REGISTER=eager: regions are registered as they are made, so the
// first lookup of a new buffer is already a hit.
TEST(Eager, NewRegionsAreRegisteredBeforeAnyLookup) {
  if (!IsRerunChild()) {
    EXPECT_EQ(RerunSelf("Eager.NewRegionsAreRegisteredBeforeAnyLookup", {"RDMALLOC_REGISTER=eager"}), 0);
    return;
  }
  void* p = malloc(size_t{72} << 20);  // a region of its own
  struct rdmalloc_stats s = Stats();
  EXPECT_GE(s.bytes_registered, uint64_t{72} << 20);
  rdmalloc_keys k;
  ASSERT_EQ(rdmalloc_lookup(p, size_t{72} << 20, nullptr, &k), RDMALLOC_OK);
  EXPECT_EQ(Stats().lookup_slow, s.lookup_slow);
  EXPECT_TRUE(CheckPageIdentity(p, size_t{72} << 20, 0, 1 << 20, 8).ok);
  free(p);
  exit(::testing::Test::HasFailure() ? 1 : 0);
}

}  // namespace
}  // namespace rdmalloc_test

namespace rdmalloc_test {
namespace {

// RDMALLOC_MAX_PINNED: past the cap, allocations still succeed, lookups say
// "registration failed" with ENOMEM, and a later lookup retries once there is
// room again.
TEST(Cap, RegistrationBeyondMaxPinnedFailsAllocationSucceedsRetryWorks) {
  if (!IsRerunChild()) {
    EXPECT_EQ(RerunSelf("Cap.RegistrationBeyondMaxPinnedFailsAllocationSucceedsRetryWorks",
                        {"RDMALLOC_MAX_PINNED=100M"}),
              0);
    return;
  }
  const size_t n = size_t{72} << 20;  // larger than a shared region: its own
  auto* a = static_cast<uint8_t*>(malloc(n));
  auto* b = static_cast<uint8_t*>(malloc(n));
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  memset(b, 3, n);  // usable memory, registered or not
  rdmalloc_keys k;
  ASSERT_EQ(rdmalloc_lookup(a, n, nullptr, &k), RDMALLOC_OK);
  errno = 0;
  EXPECT_EQ(rdmalloc_lookup(b, n, nullptr, &k), RDMALLOC_EREGFAIL);
  EXPECT_EQ(k.reg_errno, ENOMEM);
  EXPECT_EQ(errno, ENOMEM);
  struct rdmalloc_stats s = Stats();
  EXPECT_GE(s.cap_hits, 1u);
  EXPECT_EQ(s.max_pinned, uint64_t{100} << 20);
  EXPECT_LE(s.bytes_registered, uint64_t{100} << 20);
  free(a);
  ForceDecay();
  ASSERT_EQ(rdmalloc_lookup(b, n, nullptr, &k), RDMALLOC_OK) << "retry once there is room";
  EXPECT_TRUE(CheckPageIdentity(b, n, n - 4096, 4096, 5).ok);
  free(b);
  exit(::testing::Test::HasFailure() ? 1 : 0);
}

// RDMALLOC_DECAY_MS=0: jemalloc gives freed extents back at once; with
// RDMALLOC_RETAIN=0 rdmalloc keeps nothing either, so an empty region is
// deregistered and unmapped without any forced purge.
TEST(Decay, ZeroDecayReleasesAtOnce) {
  if (!IsRerunChild()) {
    EXPECT_EQ(RerunSelf("Decay.ZeroDecayReleasesAtOnce", {"RDMALLOC_DECAY_MS=0", "RDMALLOC_RETAIN=0"}),
              0);
    return;
  }
  ssize_t decay = -5;
  size_t len = sizeof decay;
  ASSERT_EQ(mallctl("arena.0.dirty_decay_ms", &decay, &len, nullptr, 0), 0);
  EXPECT_EQ(decay, 0);
  const size_t n = size_t{72} << 20;  // a region of its own
  void* p = malloc(n);
  rdmalloc_keys k;
  ASSERT_EQ(rdmalloc_lookup(p, n, nullptr, &k), RDMALLOC_OK);
  uint64_t released = Stats().regions_released;
  free(p);
  EXPECT_EQ(Stats().regions_released, released + 1);
  exit(::testing::Test::HasFailure() ? 1 : 0);
}

// RDMALLOC_RETAIN: an empty region is kept (mapped, still registered) and
// the next request reuses it without mapping or registering anything; a
// purge gives it back.
TEST(Retain, AnEmptyRegionIsKeptReusedAndGivenBackByPurge) {
  if (!IsRerunChild()) {
    EXPECT_EQ(RerunSelf("Retain.AnEmptyRegionIsKeptReusedAndGivenBackByPurge",
                        {"RDMALLOC_DECAY_MS=0", "RDMALLOC_RETAIN=128M"}),
              0);
    return;
  }
  const size_t n = size_t{72} << 20;  // > RDMALLOC_REGION_SIZE: a region of its own
  void* p = malloc(n);
  memset(p, 7, n);
  rdmalloc_keys k;
  ASSERT_EQ(rdmalloc_lookup(p, n, nullptr, &k), RDMALLOC_OK);
  struct rdmalloc_stats before = Stats();
  free(p);  // jemalloc gives it back at once (decay 0): the region is empty
  struct rdmalloc_stats kept = Stats();
  EXPECT_EQ(kept.regions_released, before.regions_released) << "released, not kept";
  EXPECT_EQ(kept.bytes_registered, before.bytes_registered) << "kept, but deregistered";
  EXPECT_GE(kept.bytes_retained, n);
  void* q = malloc(n);
  memset(q, 8, n);
  rdmalloc_keys kq;
  ASSERT_EQ(rdmalloc_lookup(q, n, nullptr, &kq), RDMALLOC_OK);
  struct rdmalloc_stats reused = Stats();
  EXPECT_EQ(kq.region_base, k.region_base) << "a new region instead of the kept one";
  EXPECT_EQ(reused.regions_created, before.regions_created);
  EXPECT_EQ(reused.reg_calls, before.reg_calls) << "the kept region was registered again";
  free(q);
  ASSERT_EQ(mallctl("arena.4096.purge", nullptr, nullptr, nullptr, 0), 0);
  struct rdmalloc_stats purged = Stats();
  EXPECT_EQ(purged.regions_released, before.regions_released + 1) << "purge kept it";
  EXPECT_EQ(purged.bytes_registered + k.region_len, before.bytes_registered);
  EXPECT_LT(purged.bytes_retained, n);
  exit(::testing::Test::HasFailure() ? 1 : 0);
}

// Past RDMALLOC_RETAIN only the excess is purged: a freed block keeps as much
// of itself resident as the bound allows (its head), so a loop over large
// blocks reuses those pages instead of faulting them in again. The whole
// block used to be purged, leaving nothing of it resident.
TEST(Retain, PastTheBoundOnlyTheExcessIsPurged) {
  if (!IsRerunChild()) {
    EXPECT_EQ(RerunSelf("Retain.PastTheBoundOnlyTheExcessIsPurged",
                        {"RDMALLOC_DECAY_MS=0", "RDMALLOC_RETAIN=8M"}),
              0);
    return;
  }
  const size_t n = size_t{24} << 20, page = 4096;
  char* p = static_cast<char*>(malloc(n));  // never looked up: not registered, purgeable
  ASSERT_NE(p, nullptr);
  memset(p, 7, n);
  uint64_t retained_before = Stats().bytes_retained;
  ASSERT_LT(retained_before, uint64_t{8} << 20);
  free(p);  // decay 0: straight back to rdmalloc, 24 MiB against an 8 MiB bound
  uint64_t retained = Stats().bytes_retained;
  EXPECT_LE(retained, uint64_t{8} << 20) << "kept past the bound";
  EXPECT_GT(retained + page, uint64_t{8} << 20) << "purged more than the excess";
  // jemalloc's extent starts at or before p (cache-oblivious offset): the
  // head that stays is measured from p's page.
  uintptr_t first = reinterpret_cast<uintptr_t>(p) & ~(page - 1);
  std::vector<unsigned char> vec(n / page);
  ASSERT_EQ(mincore(reinterpret_cast<void*>(first), n - page, vec.data()), 0);
  size_t resident = 0;
  for (size_t i = 0; i + 1 < vec.size(); i++) resident += vec[i] & 1;
  size_t kept = (uint64_t{8} << 20) - retained_before;
  EXPECT_GE(resident * page + 2 * page, kept) << "the bound's worth of the block is not resident";
  EXPECT_LE(resident * page, kept + 2 * page) << "more than the bound stayed resident";
  EXPECT_EQ(vec[vec.size() - 2] & 1, 0) << "the tail was not purged";
  exit(::testing::Test::HasFailure() ? 1 : 0);
}

// An extent jemalloc gives back after its decay time is one it kept resident
// for that long and found no use for: rdmalloc purges it rather than keep it
// resident a second time within RDMALLOC_RETAIN. Such extents used to be
// kept, stacking on jemalloc's dirty pages (mstress peaked at 1.15x
// jemalloc's RSS).
TEST(Retain, ExtentsJemallocLetDecayAreNotKeptAgain) {
  if (!IsRerunChild()) {
    EXPECT_EQ(RerunSelf("Retain.ExtentsJemallocLetDecayAreNotKeptAgain", {"RDMALLOC_DECAY_MS=1"}),
              0);
    return;
  }
  // Under a large block (2 MiB): it waits in the dirty cache.
  const size_t n = size_t{1792} << 10, page = 4096;
  uint64_t retained_before = Stats().bytes_retained;
  char* p = static_cast<char*>(malloc(n));
  ASSERT_NE(p, nullptr);
  memset(p, 7, n);
  asm volatile("" : : "r"(p) : "memory");
  free(p);
  // jemalloc decays on its allocation ticks (large blocks, past the tcache),
  // once the 1 ms decay time has passed: tick until its dirty pages are gone.
  size_t dirty = SIZE_MAX;
  for (int round = 0; round < 1000 && dirty * page >= n / 2; round++) {
    usleep(2000);
    for (int i = 0; i < 500; i++) AllocateAndFreeALargeBlock();
    uint64_t epoch = 1;
    size_t len = sizeof dirty;
    ASSERT_EQ(mallctl("epoch", nullptr, nullptr, &epoch, sizeof epoch), 0);
    ASSERT_EQ(mallctl("stats.arenas.0.pdirty", &dirty, &len, nullptr, 0), 0);
  }
  ASSERT_LT(dirty * page, n / 2) << "jemalloc never let the block decay";
  EXPECT_LT(Stats().bytes_retained, retained_before + n / 2) << "the decayed block was kept";
  // The 64 KiB blocks may have taken a few pages of it since.
  EXPECT_LT(ResidentBytes(p, n), n / 4) << "pages of the decayed block are still resident";
  exit(::testing::Test::HasFailure() ? 1 : 0);
}

// jemalloc gives an extent back at once (purged, in stock jemalloc) when it
// coalesces to 8 MiB in its dirty cache. A large block freed does, and
// rdmalloc keeps it for the next one. Freed smaller blocks coalesce to less
// than 4 MiB (the merge hook), as stock jemalloc's stop at the edges of its
// mappings: they wait in the dirty cache, resident, for reuse. They used to
// reach 8 MiB and be purged at once, and mstress at two threads purged 2.8x
// the bytes of stock jemalloc and faulted 1.3x as often. Then they coalesced
// to just under 8 MiB, too large for jemalloc to split for a slab (64 times
// the request at most), and mstress peaked at 1.05-1.08x jemalloc's RSS.
TEST(Retain, SmallBlocksStayInTheDirtyCacheButALargeBlockComesBackAndIsKept) {
  if (!IsRerunChild()) {
    EXPECT_EQ(RerunSelf("Retain.SmallBlocksStayInTheDirtyCacheButALargeBlockComesBackAndIsKept",
                        {"RDMALLOC_DECAY_MS=10000", "RDMALLOC_RETAIN=128M"}),
              0);
    return;
  }
  // 96 blocks of 256 KiB: extents of their own, past the thread cache, carved
  // side by side in regions of up to 16 MiB, then freed.
  const size_t small = size_t{256} << 10, count = 96, large = size_t{16} << 20;
  std::vector<char*> blocks(count);
  for (char*& b : blocks) {
    b = static_cast<char*>(malloc(small));
    ASSERT_NE(b, nullptr);
    memset(b, 5, small);
  }
  struct rdmalloc_stats before = Stats();
  for (char* b : blocks) free(b);
  struct rdmalloc_stats after = Stats();
  EXPECT_LT(before.bytes_in_use - after.bytes_in_use, size_t{8} << 20)
      << "jemalloc gave " << (before.bytes_in_use - after.bytes_in_use)
      << " bytes of freed small blocks back at once";
  size_t resident = 0;
  for (char* b : blocks) resident += ResidentBytes(b, small);
  EXPECT_GE(resident, count * small * 3 / 4) << "freed small blocks were purged";
  // Coalesced as far as stock jemalloc's would be, and no further.
  size_t largest = LargestDirtyExtent();
  EXPECT_LT(largest, size_t{4} << 20) << "freed small blocks coalesced past 4 MiB";
  EXPECT_GE(largest, size_t{2} << 20) << "freed small blocks did not coalesce";

  // A large block freed is kept, resident, for the next one.
  char* p = static_cast<char*>(malloc(large));
  ASSERT_NE(p, nullptr);
  memset(p, 6, large);
  asm volatile("" : : "r"(p) : "memory");
  uint64_t retained = Stats().bytes_retained;
  free(p);
  EXPECT_GE(Stats().bytes_retained, retained + large - (size_t{1} << 20))
      << "the freed large block was not kept";
  EXPECT_GE(ResidentBytes(p, large), large / 2) << "the kept large block is not resident";
  exit(::testing::Test::HasFailure() ? 1 : 0);
}

// Free pages kept within RDMALLOC_RETAIN that no request takes for a whole
// idle epoch (100 ms) are purged at the next extent rdmalloc gets back: a burst
// of large blocks does not stay resident for the rest of the run. They used
// to stay until a purge or malloc_trim asked for them.
TEST(Retain, PagesNobodyReusesAreGivenBackAfterAnEpoch) {
  if (!IsRerunChild()) {
    EXPECT_EQ(RerunSelf("Retain.PagesNobodyReusesAreGivenBackAfterAnEpoch",
                        {"RDMALLOC_DECAY_MS=0"}),
              0);
    return;
  }
  const size_t n = size_t{24} << 20;
  char* p = static_cast<char*>(malloc(n));  // never looked up: not registered, purgeable
  ASSERT_NE(p, nullptr);
  memset(p, 7, n);
  asm volatile("" : : "r"(p) : "memory");
  free(p);  // decay 0: straight back to rdmalloc, kept resident
  uint64_t kept = Stats().bytes_retained;
  ASSERT_GE(kept, n) << "the block was not kept to begin with";
  // Two epochs: the first may have begun just now, the second sees the
  // block's pages idle throughout. Small extents come and go meanwhile.
  for (int i = 0; i < 20; i++) {
    usleep(25 * 1000);
    AllocateAndFreeALargeBlock();
  }
  EXPECT_LT(Stats().bytes_retained, kept - n / 2) << "idle pages were kept";
  EXPECT_LT(ResidentBytes(p, n), n / 4) << "the idle block is still resident";
  exit(::testing::Test::HasFailure() ? 1 : 0);
}

// Kept pages are for reuse, not extra: a block that cannot reuse them and
// faults in new pages has as many kept pages given back first, so what
// rdmalloc keeps does not raise the peak RSS (large_blocks peaked at 1.23x
// jemalloc's RSS at 1 thread, 1.39x at 2).
TEST(Retain, KeptPagesDoNotRaiseThePeak) {
  if (!IsRerunChild()) {
    EXPECT_EQ(RerunSelf("Retain.KeptPagesDoNotRaiseThePeak", {"RDMALLOC_DECAY_MS=0"}), 0);
    return;
  }
  // q is larger than a shared region (64 MiB): a region of its own, all new.
  const size_t n = size_t{24} << 20, m = size_t{80} << 20, page = 4096;
  char* p = static_cast<char*>(malloc(n));  // never looked up: not registered, purgeable
  ASSERT_NE(p, nullptr);
  memset(p, 7, n);
  asm volatile("" : : "r"(p) : "memory");
  free(p);  // decay 0: straight back to rdmalloc, kept resident
  ASSERT_GE(Stats().bytes_retained, n) << "the block was not kept to begin with";
  ASSERT_GE(ResidentBytes(p, n), n / 2);
  char* q = static_cast<char*>(malloc(m));
  ASSERT_NE(q, nullptr);
  memset(q, 9, m);
  asm volatile("" : : "r"(q) : "memory");
  // p's whole pages that q did not take.
  size_t kept_resident = 0;
  uintptr_t first = (reinterpret_cast<uintptr_t>(p) + page - 1) & ~(page - 1);
  for (char* a = reinterpret_cast<char*>(first); a + page <= p + n; a += page) {
    if (a >= q && a < q + m) continue;
    kept_resident += ResidentBytes(a, page);
  }
  EXPECT_LT(kept_resident, n / 8) << "kept pages stayed resident beside the new block";
  free(q);
  exit(::testing::Test::HasFailure() ? 1 : 0);
}

// A large block of a thread comes from the thread's own arena, and freed
// comes back to rdmalloc's heap at once, as in arena 0 (and in stock
// jemalloc, past 8 MiB): it counts against RDMALLOC_RETAIN there. Every
// arena but arena 0 used to keep it in jemalloc's dirty cache for its whole
// decay time (10 s), unbounded. The fix for that then sent every thread's
// blocks of 8 MiB or more to arena 0, where all threads met on one arena
// and one shard of the region store.
TEST(Retain, LargeBlocksFreedInAnyArenaComeBackAtOnce) {
  const size_t n = size_t{16} << 20;
  unsigned arena = 0, block_arena = 0;
  uint64_t in_use_before = 0, in_use_after = 0;
  std::thread t([&] {
    size_t len = sizeof arena;
    mallctl("thread.arena", &arena, &len, nullptr, 0);
    void* p = malloc(n);
    len = sizeof block_arena;
    mallctl("arenas.lookup", &block_arena, &len, &p, sizeof p);
    memset(p, 1, n);
    asm volatile("" : : "r"(p) : "memory");  // not optimised away with its free
    in_use_before = Stats().bytes_in_use;
    free(p);
    in_use_after = Stats().bytes_in_use;
  });
  t.join();
  EXPECT_NE(arena, 0u) << "the thread was meant to have an arena of its own";
  EXPECT_EQ(block_arena, arena) << "the thread's large block came from another arena";
  EXPECT_GE(in_use_before, in_use_after + n) << "arena " << arena << " kept the freed block";
}

// A freed large block (2 MiB or more) comes back to rdmalloc's heap at once
// even when it is under jemalloc's 8 MiB: the heap keeps what the program
// wrote of it and lets the rest go. It used to wait in jemalloc's dirty cache
// for the decay time (10 s), untouched pages counted as dirty, while the heads
// of earlier blocks stayed resident across that cache: a loop over 1-32 MiB
// blocks of which the program wrote 64 KiB peaked at 2.3x jemalloc's RSS.
TEST(Retain, ALargeBlockUnder8MiBComesBackAtOnce) {
  if (!IsRerunChild()) {
    EXPECT_EQ(RerunSelf("Retain.ALargeBlockUnder8MiBComesBackAtOnce",
                        {"RDMALLOC_DECAY_MS=10000", "RDMALLOC_RETAIN=128M"}),
              0);
    return;
  }
  for (size_t n : {size_t{3} << 20, (size_t{6} << 20) + 12345}) {
    char* p = static_cast<char*>(malloc(n));
    ASSERT_NE(p, nullptr);
    memset(p, 3, n);
    asm volatile("" : : "r"(p) : "memory");  // not optimised away with its free
    struct rdmalloc_stats before = Stats();
    free(p);
    struct rdmalloc_stats after = Stats();
    EXPECT_GE(before.bytes_in_use, after.bytes_in_use + n - 4096)
        << "jemalloc kept a freed block of " << n << " bytes in its dirty cache";
    // Filled: kept whole, resident, for the next large block.
    EXPECT_GE(after.bytes_retained, before.bytes_retained + n / 2)
        << "the freed block of " << n << " bytes was not kept";
    EXPECT_GE(ResidentBytes(p, n), n / 2);
  }
  exit(::testing::Test::HasFailure() ? 1 : 0);
}

// A freed large block of a registered region reads as filled without asking
// the kernel: the registration pins its pages, so all are resident. Each free
// called mincore to find out: a system call per block (1.5 us of a loop over
// 16 MiB buffers), and, on a kernel that flushes the TLB at every system
// call, the program's next ibv_reg_mr served from the region took 2.5x as
// long. The first block, freed before anything registered its region, shows
// that the count sees the allocator's calls.
TEST(Retain, ALargeBlockOfARegisteredRegionIsFreedWithoutAskingTheKernel) {
  if (!IsRerunChild()) {
    EXPECT_EQ(RerunSelf("Retain.ALargeBlockOfARegisteredRegionIsFreedWithoutAskingTheKernel",
                        {"RDMALLOC_REGISTER=lazy", "RDMALLOC_RETAIN=128M"}),
              0);
    return;
  }
  const size_t n = size_t{16} << 20;
  for (int i = 0; i < 4; i++) {
    char* p = static_cast<char*>(malloc(n));
    ASSERT_NE(p, nullptr);
    memset(p, i, n);
    rdmalloc_keys k;
    if (i > 0) {
      ASSERT_EQ(rdmalloc_lookup(p, n, nullptr, &k), RDMALLOC_OK);
    }
    long before = g_mincore_calls.load();
    free(p);
    long calls = g_mincore_calls.load() - before;
    if (i == 0) {
      EXPECT_GE(calls, 1) << "the unregistered region's block was not probed: the count "
                             "does not see the allocator's mincore";
    } else {
      EXPECT_EQ(calls, 0) << "block " << i << " of a registered region";
    }
  }
  exit(::testing::Test::HasFailure() ? 1 : 0);
}

TEST(Debug, DumpRegionsListsEveryLiveRegion) {
  void* p = malloc(100);
  rdmalloc_keys k;
  ASSERT_EQ(rdmalloc_lookup(p, 100, nullptr, &k), RDMALLOC_OK);
  FILE* f = tmpfile();
  ASSERT_NE(f, nullptr);
  int n = rdmalloc_dump_regions(f);
  EXPECT_EQ(static_cast<uint64_t>(n), Stats().regions_live);
  rewind(f);
  char line[1024];
  int lines = 0, registered = 0;
  char want[64];
  snprintf(want, sizeof want, "region %p-", k.region_base);
  bool found = false;
  while (fgets(line, sizeof line, f) != nullptr) {
    lines++;
    registered += strstr(line, "domain 0: lkey") != nullptr;
    found |= strncmp(line, want, strlen(want)) == 0;
  }
  fclose(f);
  EXPECT_EQ(lines, n);
  EXPECT_GE(registered, 1);
  EXPECT_TRUE(found) << "the looked-up region is not listed";
  EXPECT_EQ(rdmalloc_dump_regions(nullptr), RDMALLOC_EINVAL);
  free(p);
}

}  // namespace
}  // namespace rdmalloc_test

namespace rdmalloc_test {
namespace {

// Lazy registration means a region is registered at its first lookup and not
// before: opening the backend (here by asking its name; the exit report does
// the same) must not register the heap. Eager mode alone registers every live
// region when the backend opens.
TEST(Lazy, OpeningTheBackendRegistersNothing) {
  if (!IsRerunChild()) {
    EXPECT_EQ(RerunSelf("Lazy.OpeningTheBackendRegistersNothing", {"RDMALLOC_REGISTER=lazy"}), 0);
    return;
  }
  void* p = malloc(size_t{72} << 20);  // a region of its own, before the backend opens
  memset(p, 1, size_t{72} << 20);
  long pin0 = VmPinKb();
  ASSERT_STRNE(rdmalloc_backend(), "none");
  struct rdmalloc_stats s = Stats();
  EXPECT_GE(s.regions_live, 1u);
  EXPECT_EQ(s.reg_calls, 0u);
  EXPECT_EQ(s.bytes_registered, 0u);
  EXPECT_EQ(VmPinKb(), pin0);
  rdmalloc_keys k;
  ASSERT_EQ(rdmalloc_lookup(p, size_t{72} << 20, nullptr, &k), RDMALLOC_OK);
  EXPECT_EQ(Stats().reg_calls, 1u);
  free(p);
  exit(::testing::Test::HasFailure() ? 1 : 0);
}

}  // namespace
}  // namespace rdmalloc_test
