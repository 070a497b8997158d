// The program's own ibv_reg_mr & co. (allocator/verbs_interpose.cc) against a
// stand-in libibverbs (test/fake_ibverbs.cc) that counts every kernel
// registration itself: heap requests the region's rights cover are served
// with no kernel call; stack, static, mmap, crossing, rights beyond the
// region's and bad arguments go to the library and behave as it does; and
// no region under an MR, served or forwarded, is released.
#include <dlfcn.h>
#include <errno.h>
#include <gtest/gtest.h>
#include <infiniband/verbs.h>
#include <malloc.h>
#include <sys/mman.h>

#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include "test/test_util.h"

namespace rdmalloc_test {
namespace {

struct Fake {
  void* lib = nullptr;
  int (*reg_calls)() = nullptr;
  int (*live_mrs)() = nullptr;
  ibv_pd* pd = nullptr;
  ibv_pd* pd2 = nullptr;
};

// The stand-in that rdmalloc loaded; a context and two pds from it.
Fake& TheFake() {
  static Fake f = [] {
    Fake f;
    rdmalloc_backend();  // loads the library
    f.lib = dlopen(getenv("RDMALLOC_VERBS_LIBRARY"), RTLD_NOW | RTLD_NOLOAD);
    if (f.lib == nullptr) return f;
    f.reg_calls = reinterpret_cast<int (*)()>(dlsym(f.lib, "fake_ibverbs_reg_calls"));
    f.live_mrs = reinterpret_cast<int (*)()>(dlsym(f.lib, "fake_ibverbs_live_mrs"));
    auto list = reinterpret_cast<ibv_device** (*)(int*)>(dlsym(f.lib, "ibv_get_device_list"));
    auto open = reinterpret_cast<ibv_context* (*)(ibv_device*)>(dlsym(f.lib, "ibv_open_device"));
    auto alloc_pd = reinterpret_cast<ibv_pd* (*)(ibv_context*)>(dlsym(f.lib, "ibv_alloc_pd"));
    int n = 0;
    ibv_context* ctx = open(list(&n)[0]);
    f.pd = alloc_pd(ctx);
    f.pd2 = alloc_pd(ctx);
    return f;
  }();
  return f;
}

class Interpose : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_STREQ(rdmalloc_backend(), "verbs");
    ASSERT_NE(TheFake().lib, nullptr) << "rdmalloc did not load the stand-in libibverbs";
    ASSERT_NE(TheFake().reg_calls, nullptr);
  }
  int KernelRegs() { return TheFake().reg_calls(); }
  int LiveKernelMrs() { return TheFake().live_mrs(); }
  static bool Interposing() { return getenv("RDMALLOC_INTERPOSE") == nullptr; }
};

char g_static_buffer[1 << 16];

TEST_F(Interpose, HeapMemoryIsServedWithoutAKernelCall) {
  if (!Interposing()) GTEST_SKIP() << "RDMALLOC_INTERPOSE=0: see EverythingForwardedWhenOff";
  ibv_pd* pd = TheFake().pd;
  // Warm-up: the first buffer's region gets registered on this pd.
  void* first = malloc(4096);
  ibv_mr* warm = ibv_reg_mr(pd, first, 4096, IBV_ACCESS_LOCAL_WRITE);
  ASSERT_NE(warm, nullptr);
  struct rdmalloc_stats before = Stats();
  int regs = KernelRegs();
  std::vector<void*> bufs;
  std::vector<ibv_mr*> mrs;
  for (int i = 0; i < 200; i++) {
    size_t len = 64 + 97 * i;
    void* p = malloc(len);
    memset(p, i, len);
    ibv_mr* mr = ibv_reg_mr(pd, p, len, IBV_ACCESS_LOCAL_WRITE);
    ASSERT_NE(mr, nullptr);
    EXPECT_EQ(mr->addr, p);
    EXPECT_EQ(mr->length, len);
    EXPECT_EQ(mr->pd, pd);
    EXPECT_EQ(mr->context, pd->context);
    rdmalloc_keys k;
    ASSERT_EQ(rdmalloc_lookup(p, len, pd, &k), RDMALLOC_OK);
    EXPECT_EQ(mr->lkey, k.lkey) << "the region's keys";
    EXPECT_EQ(mr->rkey, k.rkey);
    EXPECT_EQ(mr->handle, k.mr->handle);
    bufs.push_back(p);
    mrs.push_back(mr);
  }
  // Regions made meanwhile may have been registered (once each, lazily), but
  // never once per MR.
  struct rdmalloc_stats after = Stats();
  int new_regions = static_cast<int>(after.regions_created - before.regions_created);
  EXPECT_LE(KernelRegs() - regs, new_regions) << "a served MR made a kernel registration";
  EXPECT_EQ(after.mrs_served - before.mrs_served, 200u);
  EXPECT_EQ(after.mrs_live - before.mrs_live, 200u);
  for (size_t i = 0; i < mrs.size(); i++) {
    EXPECT_EQ(ibv_dereg_mr(mrs[i]), 0);
    free(bufs[i]);
  }
  EXPECT_EQ(Stats().mrs_live, before.mrs_live);
  EXPECT_EQ(ibv_dereg_mr(warm), 0);
  free(first);
}

TEST_F(Interpose, ASecondPdGetsTheHeapRegisteredOnIt) {
  if (!Interposing()) GTEST_SKIP() << "RDMALLOC_INTERPOSE=0";
  ibv_pd* pd2 = TheFake().pd2;
  uint64_t domains = Stats().domains;
  void* p = malloc(1000);
  ibv_mr* mr = ibv_reg_mr(pd2, p, 1000, IBV_ACCESS_LOCAL_WRITE);
  ASSERT_NE(mr, nullptr);
  EXPECT_EQ(mr->pd, pd2);
  EXPECT_GE(Stats().domains, domains);
  rdmalloc_keys k;
  ASSERT_EQ(rdmalloc_lookup(p, 1000, pd2, &k), RDMALLOC_OK);
  EXPECT_EQ(mr->lkey, k.lkey);
  EXPECT_EQ(ibv_dereg_mr(mr), 0);
  free(p);
}

// The heap's MRs on a pd must not keep it busy when the program frees it;
// the program's own served MRs must, as their kernel twins would.
TEST_F(Interpose, DeallocPdTakesTheHeapOffIt) {
  if (!Interposing()) GTEST_SKIP() << "RDMALLOC_INTERPOSE=0";
  auto alloc_pd = reinterpret_cast<ibv_pd* (*)(ibv_context*)>(dlsym(TheFake().lib, "ibv_alloc_pd"));
  ibv_pd* pd3 = alloc_pd(TheFake().pd->context);
  ASSERT_NE(pd3, nullptr);
  void* p = malloc(5000);
  ibv_mr* mr = ibv_reg_mr(pd3, p, 5000, IBV_ACCESS_LOCAL_WRITE);
  ASSERT_NE(mr, nullptr);
  uint64_t domains = Stats().domains;
  int live = LiveKernelMrs();
  EXPECT_EQ(ibv_dealloc_pd(pd3), EBUSY) << "a served MR is still on it";
  EXPECT_EQ(ibv_dereg_mr(mr), 0);
  EXPECT_EQ(ibv_dealloc_pd(pd3), 0);
  EXPECT_EQ(Stats().domains, domains - 1) << "the heap stayed registered on a freed pd";
  EXPECT_LT(LiveKernelMrs(), live) << "the heap's MRs on it were not deregistered";
  EXPECT_EQ(ibv_dealloc_pd(nullptr), EINVAL);
  free(p);
}

// A request that cannot be served (remote rights on the local-only plain
// heap) costs exactly one kernel registration, of the caller's range: the
// heap is not registered on its pd for nothing.
TEST_F(Interpose, AForwardedRequestRegistersNothingElse) {
  auto alloc_pd = reinterpret_cast<ibv_pd* (*)(ibv_context*)>(dlsym(TheFake().lib, "ibv_alloc_pd"));
  ibv_pd* pd4 = alloc_pd(TheFake().pd->context);
  ASSERT_NE(pd4, nullptr);
  void* p = malloc(3000);
  uint64_t domains = Stats().domains;
  int regs = KernelRegs();
  ibv_mr* mr = ibv_reg_mr(pd4, p, 3000, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  ASSERT_NE(mr, nullptr);
  EXPECT_EQ(KernelRegs(), regs + 1);
  EXPECT_EQ(Stats().domains, domains) << "the heap was registered on a pd it cannot serve";
  EXPECT_EQ(ibv_dereg_mr(mr), 0);
  EXPECT_EQ(ibv_dealloc_pd(pd4), 0);
  free(p);
}

// Each forwarded case: a kernel registration of exactly the caller's range.
void ExpectForwarded(int regs_before, ibv_mr* mr, void* addr, size_t len, int kernel_regs) {
  ASSERT_NE(mr, nullptr);
  EXPECT_EQ(kernel_regs, regs_before + 1) << "not passed to libibverbs";
  EXPECT_EQ(mr->addr, addr);
  EXPECT_EQ(mr->length, len);
}

TEST_F(Interpose, EverythingElseIsForwarded) {
  ibv_pd* pd = TheFake().pd;
  uint64_t forwarded = Stats().mrs_forwarded;
  int live = LiveKernelMrs();
  char stack[8192];
  int regs = KernelRegs();
  ibv_mr* on_stack = ibv_reg_mr(pd, stack, sizeof stack, IBV_ACCESS_LOCAL_WRITE);
  ExpectForwarded(regs, on_stack, stack, sizeof stack, KernelRegs());

  regs = KernelRegs();
  ibv_mr* on_static = ibv_reg_mr(pd, g_static_buffer, sizeof g_static_buffer, IBV_ACCESS_LOCAL_WRITE);
  ExpectForwarded(regs, on_static, g_static_buffer, sizeof g_static_buffer, KernelRegs());

  void* mapped = mmap(nullptr, 1 << 20, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(mapped, MAP_FAILED);
  regs = KernelRegs();
  ibv_mr* on_mmap = ibv_reg_mr(pd, mapped, 1 << 20, IBV_ACCESS_LOCAL_WRITE);
  ExpectForwarded(regs, on_mmap, mapped, 1 << 20, KernelRegs());

  // Rights beyond the plain heap's (local only by default).
  void* heap = malloc(4096);
  regs = KernelRegs();
  ibv_mr* remote = ibv_reg_mr(pd, heap, 4096, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ);
  ExpectForwarded(regs, remote, heap, 4096, KernelRegs());

  // Rights no region registration has (memory windows), and an iova of its own.
  regs = KernelRegs();
  ibv_mr* mw = ibv_reg_mr(pd, heap, 4096, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_MW_BIND);
  ExpectForwarded(regs, mw, heap, 4096, KernelRegs());
  regs = KernelRegs();
  ibv_mr* iova = ibv_reg_mr_iova(pd, heap, 4096, 0x1000, IBV_ACCESS_LOCAL_WRITE);
  ExpectForwarded(regs, iova, heap, 4096, KernelRegs());

  // A range over a region's end, into memory of the program's own mapped
  // right after it (a buffer larger than a region has a region of its own).
  size_t big_len = 72u << 20;
  char* big = static_cast<char*>(malloc(big_len));
  char* end = reinterpret_cast<char*>(reinterpret_cast<uintptr_t>(big + big_len) & ~uintptr_t{4095});
  while (rdmalloc_owns(end, 1)) end += 4096;  // jemalloc's extent may run past the buffer
  ASSERT_EQ(rdmalloc_owns(end - 4096, 4096), 1);
  void* after = mmap(end, 1 << 20, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
  bool crossed = after == end;
  if (crossed) {
    regs = KernelRegs();
    ibv_mr* crossing = ibv_reg_mr(pd, end - 4096, 8192, IBV_ACCESS_LOCAL_WRITE);
    ExpectForwarded(regs, crossing, end - 4096, 8192, KernelRegs());
    EXPECT_EQ(Stats().mrs_forwarded_on_heap, 4u) << "remote, mw, iova and this one";
    EXPECT_EQ(ibv_dereg_mr(crossing), 0);
    munmap(after, 1 << 20);
  } else {
    ADD_FAILURE() << "the address after a region is taken: nothing to cross into";
  }
  free(big);

  EXPECT_EQ(Stats().mrs_forwarded - forwarded, crossed ? 7u : 6u);
  for (ibv_mr* mr : {on_stack, on_static, on_mmap, remote, mw, iova}) EXPECT_EQ(ibv_dereg_mr(mr), 0);
  EXPECT_EQ(LiveKernelMrs(), live) << "a forwarded MR was not deregistered by libibverbs";
  EXPECT_EQ(Stats().mrs_forwarded_on_heap, 0u);
  free(heap);
  munmap(mapped, 1 << 20);
}

TEST_F(Interpose, BadArgumentsGetLibibverbsErrorsNotCrashes) {
  EXPECT_EQ(ibv_dereg_mr(nullptr), EINVAL);
  EXPECT_EQ(ibv_rereg_mr(nullptr, IBV_REREG_MR_CHANGE_ACCESS, nullptr, nullptr, 0, 0),
            IBV_REREG_MR_ERR_INPUT);
  if (!Interposing()) return;
  void* p = malloc(512);
  ibv_mr* mr = ibv_reg_mr(TheFake().pd, p, 512, IBV_ACCESS_LOCAL_WRITE);
  ASSERT_NE(mr, nullptr);
  ASSERT_EQ(Stats().mrs_live, 1u);
  // Bad flags, translation without a range, rights without the flag.
  EXPECT_EQ(ibv_rereg_mr(mr, 1 << 20, nullptr, nullptr, 0, 0), IBV_REREG_MR_ERR_INPUT);
  EXPECT_EQ(ibv_rereg_mr(mr, IBV_REREG_MR_CHANGE_TRANSLATION, nullptr, nullptr, 0, 0),
            IBV_REREG_MR_ERR_INPUT);
  EXPECT_EQ(ibv_rereg_mr(mr, IBV_REREG_MR_CHANGE_PD, TheFake().pd, nullptr, 0, 1),
            IBV_REREG_MR_ERR_INPUT);
  EXPECT_EQ(mr->addr, p) << "a refused rereg changed the MR";
  EXPECT_EQ(ibv_dereg_mr(mr), 0);
  EXPECT_EQ(ibv_dereg_mr(mr), EINVAL) << "a second dereg of a served MR";
  EXPECT_EQ(Stats().mrs_live, 0u);
  free(p);
}

TEST_F(Interpose, ReregMovesAServedMrWhereItMustGo) {
  if (!Interposing()) GTEST_SKIP() << "RDMALLOC_INTERPOSE=0";
  ibv_pd* pd = TheFake().pd;
  void* p = malloc(8192);
  void* q = malloc(8192);
  ibv_mr* mr = ibv_reg_mr(pd, p, 8192, IBV_ACCESS_LOCAL_WRITE);
  ASSERT_NE(mr, nullptr);
  int regs = KernelRegs();
  // Another heap buffer: served again, no kernel call.
  ASSERT_EQ(ibv_rereg_mr(mr, IBV_REREG_MR_CHANGE_TRANSLATION, nullptr, q, 4096, 0), 0);
  EXPECT_EQ(mr->addr, q);
  EXPECT_EQ(mr->length, 4096u);
  EXPECT_EQ(KernelRegs(), regs);
  // Remote rights the plain heap lacks: a kernel registration behind the same object.
  ASSERT_EQ(ibv_rereg_mr(mr, IBV_REREG_MR_CHANGE_ACCESS, nullptr, nullptr, 0,
                         IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ),
            0);
  EXPECT_EQ(KernelRegs(), regs + 1);
  EXPECT_EQ(mr->addr, q);
  int live = LiveKernelMrs();
  EXPECT_EQ(ibv_dereg_mr(mr), 0);
  EXPECT_EQ(LiveKernelMrs(), live - 1) << "the kernel registration behind it stayed";
  // A forwarded MR's rereg goes to libibverbs.
  char stack[4096];
  ibv_mr* fwd = ibv_reg_mr(pd, stack, sizeof stack, IBV_ACCESS_LOCAL_WRITE);
  ASSERT_NE(fwd, nullptr);
  ASSERT_EQ(ibv_rereg_mr(fwd, IBV_REREG_MR_CHANGE_TRANSLATION, nullptr, p, 8192, 0), 0);
  EXPECT_EQ(fwd->addr, p);
  EXPECT_EQ(Stats().mrs_forwarded_on_heap, 1u) << "now on heap pages: it holds their region";
  EXPECT_EQ(ibv_dereg_mr(fwd), 0);
  EXPECT_EQ(Stats().mrs_forwarded_on_heap, 0u);
  free(p);
  free(q);
}

// An MR on memory the program freed keeps its region: freed, decayed, trimmed,
// and still mapped (and registered) until the MR goes.
void ExpectHeldUntilDereg(ibv_mr* mr, void* block, size_t len) {
  const char* p = AddressOnly(block);  // whether rdmalloc still owns it
  free(block);
  for (int i = 0; i < 3; i++) {
    ForceDecay();
    malloc_trim(0);
  }
  EXPECT_EQ(rdmalloc_owns(p, len), 1) << "a region under a live MR was released";
  EXPECT_GE(Stats().releases_held_by_mrs, 1u);
  EXPECT_EQ(ibv_dereg_mr(mr), 0);
  for (int i = 0; i < 3 && rdmalloc_owns(p, len); i++) {
    ForceDecay();
    malloc_trim(0);
  }
  EXPECT_EQ(rdmalloc_owns(p, len), 0) << "the region stayed after its last MR went";
}

// A deregistered MR object goes to the back of the free records (batches
// are taken from the front), so a stale second ibv_dereg_mr keeps finding it
// free, and failing, for thousands of registrations.
TEST_F(Interpose, AFreedMrObjectIsReusedLast) {
  if (!Interposing()) GTEST_SKIP() << "RDMALLOC_INTERPOSE=0: see EverythingForwardedWhenOff";
  ibv_pd* pd = TheFake().pd;
  void* p = malloc(4096);
  ibv_mr* stale = ibv_reg_mr(pd, p, 4096, IBV_ACCESS_LOCAL_WRITE);
  ASSERT_NE(stale, nullptr);
  ASSERT_EQ(ibv_dereg_mr(stale), 0);
  const int kPairs = 3000;
  int reused_at = -1;
  for (int i = 0; i < kPairs && reused_at < 0; i++) {
    ibv_mr* mr = ibv_reg_mr(pd, p, 4096, IBV_ACCESS_LOCAL_WRITE);
    ASSERT_NE(mr, nullptr);
    if (mr == stale) reused_at = i;
    ASSERT_EQ(ibv_dereg_mr(mr), 0);
  }
  EXPECT_EQ(reused_at, -1) << "a freed MR object came back after " << reused_at << " pairs";
  EXPECT_EQ(ibv_dereg_mr(stale), EINVAL);
  free(p);
}

// Each thread takes MR records a batch at a time; an exiting thread gives
// its batch back. Were it lost, 40000 short-lived threads would strand more
// records than the table can ever hold (256 x 4096), and the later ones'
// registrations would be forwarded.
TEST_F(Interpose, ThreadsGiveTheirMrRecordsBackWhenTheyExit) {
  if (!Interposing()) GTEST_SKIP() << "RDMALLOC_INTERPOSE=0: see EverythingForwardedWhenOff";
  ibv_pd* pd = TheFake().pd;
  void* p = malloc(4096);
  ibv_mr* warm = ibv_reg_mr(pd, p, 4096, IBV_ACCESS_LOCAL_WRITE);
  ASSERT_NE(warm, nullptr);
  ASSERT_EQ(ibv_dereg_mr(warm), 0);
  struct rdmalloc_stats before = Stats();
  const int kThreads = 40000;
  int failed = 0;
  for (int i = 0; i < kThreads; i++) {
    std::thread t([&] {
      ibv_mr* mr = ibv_reg_mr(pd, p, 4096, IBV_ACCESS_LOCAL_WRITE);
      if (mr == nullptr || ibv_dereg_mr(mr) != 0) failed++;
    });
    t.join();
  }
  struct rdmalloc_stats after = Stats();
  EXPECT_EQ(failed, 0);
  EXPECT_EQ(after.mrs_served - before.mrs_served, static_cast<uint64_t>(kThreads));
  EXPECT_EQ(after.mrs_forwarded, before.mrs_forwarded) << "records ran out";
  EXPECT_EQ(after.mrs_live, before.mrs_live);
  free(p);
}

TEST_F(Interpose, AServedMrHoldsItsRegion) {
  if (!Interposing()) GTEST_SKIP() << "RDMALLOC_INTERPOSE=0";
  size_t len = 48u << 20;  // a region of its own
  void* p = malloc(len);
  ibv_mr* mr = ibv_reg_mr(TheFake().pd, p, len, IBV_ACCESS_LOCAL_WRITE);
  ASSERT_NE(mr, nullptr);
  ASSERT_EQ(Stats().mrs_live, 1u) << "not served";
  ExpectHeldUntilDereg(mr, p, len);
}

TEST_F(Interpose, AForwardedMrOnHeapPagesHoldsItsRegion) {
  size_t len = 48u << 20;
  void* p = malloc(len);
  ibv_mr* mr = ibv_reg_mr(TheFake().pd, p, len, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  ASSERT_NE(mr, nullptr);
  ASSERT_EQ(Stats().mrs_forwarded_on_heap, 1u);
  ExpectHeldUntilDereg(mr, p, len);
}

TEST_F(Interpose, EverythingForwardedWhenOff) {
  if (Interposing()) {
    EXPECT_EQ(RerunSelf("Interpose.EverythingForwardedWhenOff", {"RDMALLOC_INTERPOSE=0"}), 0);
    return;
  }
  void* p = malloc(4096);
  int regs = KernelRegs();
  ibv_mr* mr = ibv_reg_mr(TheFake().pd, p, 4096, IBV_ACCESS_LOCAL_WRITE);
  ExpectForwarded(regs, mr, p, 4096, KernelRegs());
  EXPECT_EQ(Stats().mrs_served, 0u);
  EXPECT_EQ(ibv_dereg_mr(mr), 0);
  free(p);
}

}  // namespace
}  // namespace rdmalloc_test
