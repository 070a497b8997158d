// The verbs backend on a real (soft-RoCE) device: registration through
// ibv_reg_mr, rdmalloc_dma_* through a loopback RC QP, the page-identity
// oracle, region release, a second PD, fork. Runs inside test/vm/run.sh's VM
// (target //test:verbs_vm_test), where rxe0 exists; the test binary's malloc
// is rdmalloc.
#include <errno.h>
#include <gtest/gtest.h>
#include <infiniband/verbs.h>
#include <sys/mman.h>
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
#include <thread>
#include <vector>

#include "test/test_util.h"

namespace rdmalloc_test {
namespace {

constexpr size_t kMiB = size_t{1} << 20;
constexpr int kAllAccess =
    RDMALLOC_ACCESS_LOCAL_WRITE | RDMALLOC_ACCESS_REMOTE_READ | RDMALLOC_ACCESS_REMOTE_WRITE;

// Buffers a peer reads and writes: the plain heap is local-only.
void* RemoteAlloc(size_t n) {
  return rdmalloc_alloc(n, RDMALLOC_REMOTE_READ | RDMALLOC_REMOTE_WRITE);
}

// Fill/Mismatches over the whole buffer, with the word pattern.
void Fill(void* p, size_t n, uint64_t seed) { FillWords(p, 0, n, seed); }
size_t Mismatches(const void* p, size_t n, uint64_t seed) { return WordMismatches(p, 0, n, seed); }

// The page-identity oracle both ways through the registration under `pd`:
// NIC -> CPU (dma_write, then the CPU reads) and CPU -> NIC (the CPU writes,
// then dma_read).
struct Oracle {
  int lookup = -99, write = -99, read = -99;
  size_t nic_to_cpu = SIZE_MAX, cpu_to_nic = SIZE_MAX;
  double write_s = 0, read_s = 0;
  bool ok() const {
    return lookup == RDMALLOC_OK && write == RDMALLOC_OK && read == RDMALLOC_OK &&
           nic_to_cpu == 0 && cpu_to_nic == 0;
  }
  std::string str() const {
    char s[200];
    snprintf(s, sizeof s, "lookup %d, dma_write %d, dma_read %d (errno %d), mismatches NIC->CPU %zu, "
             "CPU->NIC %zu", lookup, write, read, errno, nic_to_cpu, cpu_to_nic);
    return s;
  }
};

Oracle CheckBothWays(void* p, size_t n, ibv_pd* pd, uint64_t seed) {
  Oracle o;
  rdmalloc_keys k;
  o.lookup = rdmalloc_lookup(p, n, pd, &k);
  if (o.lookup != RDMALLOC_OK) return o;
  std::vector<uint8_t> buf(n);
  Fill(buf.data(), n, seed);
  double t = NowSeconds();
  o.write = rdmalloc_dma_write(&k, 0, buf.data(), n);
  o.write_s = NowSeconds() - t;
  if (o.write != RDMALLOC_OK) return o;
  o.nic_to_cpu = Mismatches(p, n, seed);
  Fill(p, n, seed + 1);
  memset(buf.data(), 0, n);
  t = NowSeconds();
  o.read = rdmalloc_dma_read(&k, 0, buf.data(), n);
  o.read_s = NowSeconds() - t;
  if (o.read != RDMALLOC_OK) return o;
  o.cpu_to_nic = Mismatches(buf.data(), n, seed + 1);
  return o;
}

// A second verbs context on rxe0 with its own PDs (what an application that
// drives another device, or another context, hands to rdmalloc_add_pd).
struct OwnContext {
  ibv_context* ctx = nullptr;
  OwnContext() {
    int n = 0;
    ibv_device** list = ibv_get_device_list(&n);
    for (int i = 0; list != nullptr && i < n && ctx == nullptr; i++) {
      if (strcmp(ibv_get_device_name(list[i]), "rxe0") == 0) ctx = ibv_open_device(list[i]);
    }
    if (list != nullptr) ibv_free_device_list(list);
  }
  ~OwnContext() {
    if (ctx != nullptr) {
      EXPECT_EQ(ibv_close_device(ctx), 0);
    }
  }
};

TEST(VerbsVm, BackendIsVerbsOnRxe0) {
  ASSERT_STREQ(rdmalloc_backend(), "verbs");
  void* p = malloc(100);
  rdmalloc_keys k;
  ASSERT_EQ(rdmalloc_lookup(p, 100, nullptr, &k), RDMALLOC_OK);
  ASSERT_NE(k.mr, nullptr);
  EXPECT_EQ(k.handle, static_cast<void*>(k.mr));
  EXPECT_EQ(k.domain, 0);
  EXPECT_STREQ(ibv_get_device_name(k.mr->context->device), "rxe0");
  free(p);
}

// The security default on a real NIC: plain heap memory is registered for
// local access only, so a peer's RDMA WRITE or READ through its keys is
// refused by the NIC itself (remote access error), and memory is untouched.
// Class memory from rdmalloc_alloc gets exactly its rights.
TEST(VerbsVm, NicRefusesRemoteAccessThroughPlainHeapKeys) {
  const size_t n = 64 << 10;
  auto* plain = static_cast<uint8_t*>(malloc(n));
  memset(plain, 0x11, n);
  rdmalloc_keys k;
  ASSERT_EQ(rdmalloc_lookup(plain, n, nullptr, &k), RDMALLOC_OK);
  EXPECT_EQ(k.access, RDMALLOC_ACCESS_LOCAL_WRITE);
  ASSERT_NE(k.mr, nullptr);
  EXPECT_EQ(k.mr->rkey, k.rkey);
  std::vector<uint8_t> buf(n, 0x22);
  errno = 0;
  EXPECT_EQ(rdmalloc_dma_write(&k, 0, buf.data(), n), RDMALLOC_EDMA);
  EXPECT_EQ(errno, EACCES) << "the NIC must refuse a remote write into a local-only MR";
  for (size_t i = 0; i < n; i++) ASSERT_EQ(plain[i], 0x11) << "byte " << i << " changed";
  errno = 0;
  EXPECT_EQ(rdmalloc_dma_read(&k, 0, buf.data(), n), RDMALLOC_EDMA);
  EXPECT_EQ(errno, EACCES);
  // A write-only class buffer: writes land, reads are refused.
  auto* wo = static_cast<uint8_t*>(rdmalloc_alloc(n, RDMALLOC_REMOTE_WRITE));
  ASSERT_NE(wo, nullptr);
  rdmalloc_keys kw;
  ASSERT_EQ(rdmalloc_lookup(wo, n, nullptr, &kw), RDMALLOC_OK);
  EXPECT_NE(kw.region_base, k.region_base) << "class memory shares a region with plain memory";
  EXPECT_EQ(rdmalloc_dma_write(&kw, 0, buf.data(), n), RDMALLOC_OK);
  EXPECT_EQ(memcmp(wo, buf.data(), n), 0);
  EXPECT_EQ(rdmalloc_dma_read(&kw, 0, buf.data(), n), RDMALLOC_EDMA);
  // The QP recovered after the refusals: a read-write buffer works both ways.
  void* rw = RemoteAlloc(n);
  Oracle o = CheckBothWays(rw, n, nullptr, 77);
  EXPECT_TRUE(o.ok()) << o.str();
  free(rw);
  free(wo);
  free(plain);
}

TEST(VerbsVm, PageIdentityBothWaysFrom8BytesTo64MiB) {
  const size_t sizes[] = {8,        100,      4096,         4097,     64 << 10, 256 << 10,
                          1 * kMiB, kMiB + 13, 3 * kMiB + 5, 8 * kMiB, 24 * kMiB, 40 * kMiB,
                          64 * kMiB};
  printf("%12s %6s %10s %10s %9s %9s\n", "size", "regs", "reg MiB", "reg us", "wr MB/s",
         "rd MB/s");
  uint64_t seed = 1000;
  for (size_t n : sizes) {
    SCOPED_TRACE("size " + std::to_string(n));
    auto* p = static_cast<uint8_t*>(RemoteAlloc(n));
    ASSERT_NE(p, nullptr);
    struct rdmalloc_stats s0 = Stats();
    rdmalloc_keys k;
    ASSERT_EQ(rdmalloc_lookup(p, n, nullptr, &k), RDMALLOC_OK);
    struct rdmalloc_stats s1 = Stats();
    ASSERT_NE(k.mr, nullptr);
    EXPECT_EQ(k.mr->lkey, k.lkey);
    EXPECT_EQ(k.mr->rkey, k.rkey);
    EXPECT_LE(static_cast<uint8_t*>(k.mr->addr), p);
    EXPECT_GE(static_cast<uint8_t*>(k.mr->addr) + k.mr->length, p + n) << "the MR covers it";

    Oracle o = CheckBothWays(p, n, nullptr, seed);
    EXPECT_TRUE(o.ok()) << o.str();
    seed += 2;

    // A short transfer at an odd offset lands exactly there, nowhere else.
    if (n >= 64) {
      const size_t off = n / 2 + 3, len = 13;
      std::vector<uint8_t> pattern(n);
      Fill(pattern.data(), n, seed);
      memcpy(p, pattern.data(), n);
      std::vector<uint8_t> src(len, 0x5a);
      ASSERT_EQ(rdmalloc_dma_write(&k, off, src.data(), len), RDMALLOC_OK);
      EXPECT_EQ(memcmp(p + off, src.data(), len), 0);
      EXPECT_EQ(memcmp(p, pattern.data(), off), 0) << "bytes before the window changed";
      EXPECT_EQ(memcmp(p + off + len, pattern.data() + off + len, n - off - len), 0)
          << "bytes after the window changed";
      memset(p + off, 0xa5, len);
      std::vector<uint8_t> back(len);
      ASSERT_EQ(rdmalloc_dma_read(&k, off, back.data(), len), RDMALLOC_OK);
      EXPECT_EQ(back, std::vector<uint8_t>(len, 0xa5));
      seed++;
    }
    uint64_t regs = s1.reg_calls - s0.reg_calls;
    printf("%12zu %6" PRIu64 " %10.1f %10.0f %9.1f %9.1f\n", n, regs,
           (s1.bytes_registered - s0.bytes_registered) / double(kMiB),
           regs != 0 ? (s1.reg_ns - s0.reg_ns) / 1e3 / regs : 0.0,
           o.write_s > 0 ? n / o.write_s / 1e6 : 0.0, o.read_s > 0 ? n / o.read_s / 1e6 : 0.0);
    free(p);
  }
}

TEST(VerbsVm, ConcurrentDmaFromThreads) {
  auto work = [](int id, bool* ok) {
    *ok = true;
    for (int i = 0; i < 8; i++) {
      size_t n = (size_t{64} << 10) * (1 + (i + id) % 4) + id;
      void* p = RemoteAlloc(n);
      Oracle o = CheckBothWays(p, n, nullptr, 5000 + id * 100 + i);
      if (!o.ok()) {
        fprintf(stderr, "thread %d, round %d: %s\n", id, i, o.str().c_str());
        *ok = false;
      }
      free(p);
    }
  };
  bool ok[4];
  std::vector<std::thread> threads;
  for (int i = 0; i < 4; i++) threads.emplace_back(work, i, &ok[i]);
  for (auto& t : threads) t.join();
  for (int i = 0; i < 4; i++) EXPECT_TRUE(ok[i]) << "thread " << i;
}

TEST(VerbsVm, ReleasedRegionsAreDeregisteredAndUnpinned) {
  ForceDecay();
  struct rdmalloc_stats s0 = Stats();
  long pin0 = VmPinKb();
  std::vector<void*> bufs;
  for (int i = 0; i < 16; i++) {
    void* p = malloc(8 * kMiB);
    ASSERT_NE(p, nullptr);
    rdmalloc_keys k;
    ASSERT_EQ(rdmalloc_lookup(p, 8 * kMiB, nullptr, &k), RDMALLOC_OK);
    ASSERT_NE(k.mr, nullptr);
    bufs.push_back(p);
  }
  struct rdmalloc_stats s1 = Stats();
  long pin1 = VmPinKb();
  // Absolute, not relative to s0: earlier tests' free regions may still be
  // registered at s0 (a decay pass run by another thread, e.g. inside the
  // release thread's own mallocs, can release them a moment later) and then
  // serve some of these buffers without a new registration.
  EXPECT_GE(s1.bytes_registered, 128 * kMiB);
  EXPECT_GE(pin1, 128 * 1024L) << "the rxe MRs pin (VmPin)";
  for (void* p : bufs) free(p);
  ForceDecay();
  struct rdmalloc_stats s2 = Stats();  // performs the deregistrations queued by the hooks
  long pin2 = VmPinKbWhen([](long kb, long want) { return kb <= want; }, pin0 + 16 * 1024L);
  printf("VmPin %ld -> %ld -> %ld kB; registered %" PRIu64 " -> %" PRIu64 " -> %" PRIu64
         " MiB; %" PRIu64 " regions released, %" PRIu64 " deregistrations (%" PRIu64
         " deferred releases)\n",
         pin0, pin1, pin2, s0.bytes_registered >> 20, s1.bytes_registered >> 20,
         s2.bytes_registered >> 20, s2.regions_released - s1.regions_released,
         s2.dereg_calls - s1.dereg_calls, s2.releases_deferred - s1.releases_deferred);
  EXPECT_GT(s2.dereg_calls, s1.dereg_calls);
  EXPECT_GT(s2.regions_released, s1.regions_released);
  EXPECT_LT(pin2, pin1);
  EXPECT_LE(pin2, pin0 + 16 * 1024L);
  EXPECT_LE(s2.bytes_registered, s0.bytes_registered + 16 * kMiB);

  // New memory after the release: registered again, page identity holds.
  void* p = RemoteAlloc(8 * kMiB);
  Oracle o = CheckBothWays(p, 8 * kMiB, nullptr, 77);
  EXPECT_TRUE(o.ok()) << o.str();
  free(p);
}

TEST(VerbsVm, SecondPdHasItsOwnKeysAndDataPath) {
  OwnContext own;
  ASSERT_NE(own.ctx, nullptr);
  ibv_pd* pd = ibv_alloc_pd(own.ctx);
  ASSERT_NE(pd, nullptr);
  ASSERT_EQ(rdmalloc_add_pd(pd, kAllAccess), RDMALLOC_OK);

  const size_t n = 4 * kMiB;
  auto* p = static_cast<uint8_t*>(RemoteAlloc(n));
  rdmalloc_keys k0, k1;
  ASSERT_EQ(rdmalloc_lookup(p, n, nullptr, &k0), RDMALLOC_OK);
  ASSERT_EQ(rdmalloc_lookup(p, n, pd, &k1), RDMALLOC_OK);
  ASSERT_NE(k0.mr, nullptr);
  ASSERT_NE(k1.mr, nullptr);
  EXPECT_NE(k0.mr, k1.mr);
  EXPECT_EQ(k1.mr->pd, pd);
  EXPECT_NE(k0.mr->pd, pd);
  EXPECT_NE(k1.domain, 0);
  EXPECT_EQ(k1.region_base, k0.region_base);
  EXPECT_NE(k0.lkey, k1.lkey);
  EXPECT_NE(k0.rkey, k1.rkey);
  EXPECT_EQ(k1.mr->lkey, k1.lkey);
  EXPECT_EQ(k1.mr->rkey, k1.rkey);

  Oracle o0 = CheckBothWays(p, n, nullptr, 300);
  EXPECT_TRUE(o0.ok()) << "default pd: " << o0.str();
  Oracle o1 = CheckBothWays(p, n, pd, 310);
  EXPECT_TRUE(o1.ok()) << "second pd: " << o1.str();
  // Across domains: written under one PD, read under the other.
  std::vector<uint8_t> buf(n);
  Fill(buf.data(), n, 320);
  ASSERT_EQ(rdmalloc_dma_write(&k1, 0, buf.data(), n), RDMALLOC_OK);
  memset(buf.data(), 0, n);
  ASSERT_EQ(rdmalloc_dma_read(&k0, 0, buf.data(), n), RDMALLOC_OK);
  EXPECT_EQ(Mismatches(buf.data(), n, 320), 0u);
  EXPECT_EQ(Mismatches(p, n, 320), 0u);

  ASSERT_EQ(rdmalloc_remove_pd(pd), RDMALLOC_OK);
  // The domain's QP, CQ and staging MR are gone with it: the PD is free.
  EXPECT_EQ(ibv_dealloc_pd(pd), 0);
  EXPECT_TRUE(CheckBothWays(p, n, nullptr, 330).ok()) << "the default domain stays";
  free(p);
}

TEST(VerbsVm, MrWithoutRemoteAccessFailsWithEACCESAndTheQpRecovers) {
  OwnContext own;
  ASSERT_NE(own.ctx, nullptr);
  ibv_pd* write_only = ibv_alloc_pd(own.ctx);
  ibv_pd* local_only = ibv_alloc_pd(own.ctx);
  ASSERT_NE(write_only, nullptr);
  ASSERT_NE(local_only, nullptr);
  ASSERT_EQ(rdmalloc_add_pd(write_only,
                            RDMALLOC_ACCESS_LOCAL_WRITE | RDMALLOC_ACCESS_REMOTE_WRITE),
            RDMALLOC_OK);
  ASSERT_EQ(rdmalloc_add_pd(local_only, RDMALLOC_ACCESS_LOCAL_WRITE), RDMALLOC_OK);

  const size_t n = 256 << 10;
  auto* p = static_cast<uint8_t*>(malloc(n));
  std::vector<uint8_t> buf(n);
  rdmalloc_keys kw, kl;
  ASSERT_EQ(rdmalloc_lookup(p, n, write_only, &kw), RDMALLOC_OK);
  ASSERT_EQ(rdmalloc_lookup(p, n, local_only, &kl), RDMALLOC_OK);

  // REMOTE_WRITE but no REMOTE_READ.
  Fill(buf.data(), n, 400);
  ASSERT_EQ(rdmalloc_dma_write(&kw, 0, buf.data(), n), RDMALLOC_OK);
  EXPECT_EQ(Mismatches(p, n, 400), 0u);
  errno = 0;
  EXPECT_EQ(rdmalloc_dma_read(&kw, 0, buf.data(), n), RDMALLOC_EDMA);
  EXPECT_EQ(errno, EACCES);
  // The failed READ put the QP in the error state; the next transfer works.
  Fill(buf.data(), n, 401);
  EXPECT_EQ(rdmalloc_dma_write(&kw, 0, buf.data(), n), RDMALLOC_OK);
  EXPECT_EQ(Mismatches(p, n, 401), 0u);
  errno = 0;
  EXPECT_EQ(rdmalloc_dma_read(&kw, 0, buf.data(), 8), RDMALLOC_EDMA);
  EXPECT_EQ(errno, EACCES);

  // Local access only: the NIC refuses both directions.
  Fill(p, n, 402);
  errno = 0;
  EXPECT_EQ(rdmalloc_dma_write(&kl, 0, buf.data(), n), RDMALLOC_EDMA);
  EXPECT_EQ(errno, EACCES);
  EXPECT_EQ(Mismatches(p, n, 402), 0u) << "a refused write must not change memory";
  errno = 0;
  EXPECT_EQ(rdmalloc_dma_read(&kl, 0, buf.data(), n), RDMALLOC_EDMA);
  EXPECT_EQ(errno, EACCES);

  // Other domains are unaffected: the default domain is local-only for the
  // plain heap too, and a remote buffer there works both ways.
  rdmalloc_keys k0;
  ASSERT_EQ(rdmalloc_lookup(p, n, nullptr, &k0), RDMALLOC_OK);
  EXPECT_EQ(k0.access, RDMALLOC_ACCESS_LOCAL_WRITE);
  void* rw = RemoteAlloc(n);
  EXPECT_TRUE(CheckBothWays(rw, n, nullptr, 410).ok());
  free(rw);

  ASSERT_EQ(rdmalloc_remove_pd(write_only), RDMALLOC_OK);
  ASSERT_EQ(rdmalloc_remove_pd(local_only), RDMALLOC_OK);
  EXPECT_EQ(ibv_dealloc_pd(write_only), 0);
  EXPECT_EQ(ibv_dealloc_pd(local_only), 0);
  free(p);
}

TEST(VerbsVm, ForkChildUsesItsHeapParentKeysStayValid) {
  const size_t n = 2 * kMiB;
  auto* p = static_cast<uint8_t*>(RemoteAlloc(n));
  Fill(p, n, 20);
  rdmalloc_keys k;
  ASSERT_EQ(rdmalloc_lookup(p, n, nullptr, &k), RDMALLOC_OK);
  Oracle before = CheckBothWays(p, n, nullptr, 600);  // the QP exists before the fork
  ASSERT_TRUE(before.ok()) << before.str();
  Fill(p, n, 21);
  fflush(stdout);
  fflush(stderr);
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    int fails = 0;
    auto fail = [&fails](const char* what) {
      fprintf(stderr, "fork child: %s\n", what);
      fails++;
    };
    if (Mismatches(p, n, 21) != 0) fail("the parent's data is not in the child");
    std::vector<void*> v;
    for (int i = 0; i < 1000; i++) v.push_back(malloc(64 + i * 100));
    for (void* q : v) free(q);
    void* fresh = malloc(n);
    Fill(fresh, n, 22);
    if (Mismatches(fresh, n, 22) != 0) fail("fresh memory is wrong");
    // The child's verbs domains refuse to register (the context is the
    // parent's), and the parent's registrations are not the child's.
    rdmalloc_keys kc;
    int rc = rdmalloc_lookup(fresh, n, nullptr, &kc);
    if (rc == RDMALLOC_OK) fail("the child registered through the parent's context");
    uint8_t byte;
    if (rdmalloc_dma_read(&k, 0, &byte, 1) == RDMALLOC_OK) fail("the child used the parent's QP");
    free(fresh);
    Fill(p, n, 23);  // the child's copy only
    _exit(fails == 0 ? 0 : 1);
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
  EXPECT_EQ(Mismatches(p, n, 21), 0u) << "the child's writes stayed in the child";
  std::vector<uint8_t> nic(n);
  ASSERT_EQ(rdmalloc_dma_read(&k, 0, nic.data(), n), RDMALLOC_OK) << "parent keys after fork";
  EXPECT_EQ(Mismatches(nic.data(), n, 21), 0u);
  // The parent's pages are still the pinned ones, both ways.
  Oracle after = CheckBothWays(p, n, nullptr, 610);
  EXPECT_TRUE(after.ok()) << after.str();
  free(p);
}

// Negative control: the oracle must notice when the CPU and the NIC stop
// seeing the same page. Purge a registered buffer behind rdmalloc's back; the
// CPU then writes to a fresh page while the MR still holds the old one.
TEST(VerbsVm, NegativeControlPurgeBehindRdmallocsBackIsDetected) {
  const size_t n = kMiB;
  void* raw = nullptr;
  raw = rdmalloc_aligned_alloc(n, n, RDMALLOC_REMOTE_READ | RDMALLOC_REMOTE_WRITE);
  ASSERT_NE(raw, nullptr);
  auto* p = static_cast<uint8_t*>(raw);
  rdmalloc_keys k;
  ASSERT_EQ(rdmalloc_lookup(p, n, nullptr, &k), RDMALLOC_OK);
  Fill(p, n, 700);
  std::vector<uint8_t> nic(n);
  ASSERT_EQ(rdmalloc_dma_read(&k, 0, nic.data(), n), RDMALLOC_OK);
  ASSERT_EQ(Mismatches(nic.data(), n, 700), 0u) << "positive control";

  ASSERT_EQ(madvise(p, n, MADV_DONTNEED), 0);
  Fill(p, n, 701);
  ASSERT_EQ(rdmalloc_dma_read(&k, 0, nic.data(), n), RDMALLOC_OK);
  size_t bad = Mismatches(nic.data(), n, 701);
  printf("negative control: %zu of %zu bytes differ after the purge (NIC sees the old page: %s)\n",
         bad, n, Mismatches(nic.data(), n, 700) == 0 ? "yes" : "no");
  EXPECT_GT(bad, n / 2) << "the oracle did not detect the purge";
  EXPECT_EQ(Mismatches(nic.data(), n, 700), 0u) << "the NIC should still see the pinned pages";
  // Deliberately not freed: these pages no longer match their MR, and must not
  // go back to the heap for later tests.
}

// Not a check: what registration costs on rxe, through rdmalloc and direct.
TEST(VerbsVm, ZzRegistrationCosts) {
  struct rdmalloc_stats s = Stats();
  printf("rdmalloc_stats: %" PRIu64 " registrations, %.1f us each (%.1f ms total); %" PRIu64
         " deregistrations, %.1f us each (%.1f ms total); %" PRIu64 " lookups, %" PRIu64
         " slow; %" PRIu64 " regions created, %" PRIu64 " released\n",
         s.reg_calls, s.reg_calls ? s.reg_ns / 1e3 / s.reg_calls : 0.0, s.reg_ns / 1e6,
         s.dereg_calls, s.dereg_calls ? s.dereg_ns / 1e3 / s.dereg_calls : 0.0, s.dereg_ns / 1e6,
         s.lookups, s.lookup_slow, s.regions_created, s.regions_released);
  EXPECT_GT(s.reg_calls, 0u);
  EXPECT_EQ(s.reg_failures, 0u);

  OwnContext own;
  ASSERT_NE(own.ctx, nullptr);
  ibv_pd* pd = ibv_alloc_pd(own.ctx);
  ASSERT_NE(pd, nullptr);
  printf("%10s %14s %14s %14s\n", "ibv_reg_mr", "reg (cold) us", "reg (warm) us", "dereg us");
  for (size_t mib : {2, 8, 32, 128}) {
    size_t n = mib * kMiB;
    void* p = mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    ASSERT_NE(p, MAP_FAILED);
    double t = NowSeconds();  // untouched pages: the pin faults them in
    ibv_mr* mr = ibv_reg_mr(pd, p, n, kAllAccess);
    double cold = NowSeconds() - t;
    ASSERT_NE(mr, nullptr);
    t = NowSeconds();
    ASSERT_EQ(ibv_dereg_mr(mr), 0);
    double dereg = NowSeconds() - t;
    t = NowSeconds();  // resident pages
    mr = ibv_reg_mr(pd, p, n, kAllAccess);
    double warm = NowSeconds() - t;
    ASSERT_NE(mr, nullptr);
    ASSERT_EQ(ibv_dereg_mr(mr), 0);
    munmap(p, n);
    printf("%7zu MiB %14.0f %14.0f %14.0f\n", mib, cold * 1e6, warm * 1e6, dereg * 1e6);
  }
  EXPECT_EQ(ibv_dealloc_pd(pd), 0);
}

}  // namespace
}  // namespace rdmalloc_test
