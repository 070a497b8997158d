#include "verbs/uring_registrar.h"

#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include "test/proc_status.h"

namespace rdmalloc {
namespace {

constexpr size_t kBufBytes = size_t{4} << 20;

long VmPinKb() { return rdmalloc_test::StatusKb("VmPin"); }

// Unpinning may be deferred by the kernel: poll up to 1 s for `ok(VmPin)`.
template <typename Pred>
long WaitForVmPin(Pred ok) {
  long kb = VmPinKb();
  for (int i = 0; i < 1000 && !ok(kb); i++) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
    kb = VmPinKb();
  }
  return kb;
}

// A pattern that differs per (seed, offset).
uint8_t PatternByte(uint64_t seed, size_t i) {
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + i;
  x ^= x >> 29;
  x *= 0xBF58476D1CE4E5B9ull;
  return static_cast<uint8_t>(x >> 32);
}
void Fill(void* p, size_t n, uint64_t seed) {
  for (size_t i = 0; i < n; i++) static_cast<uint8_t*>(p)[i] = PatternByte(seed, i);
}
bool Has(const void* p, size_t n, uint64_t seed) {
  for (size_t i = 0; i < n; i++)
    if (static_cast<const uint8_t*>(p)[i] != PatternByte(seed, i)) return false;
  return true;
}

struct Mapping {
  explicit Mapping(size_t n) : len(n) {
    void* m = mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    p = m == MAP_FAILED ? nullptr : static_cast<char*>(m);
  }
  ~Mapping() {
    if (p != nullptr) munmap(p, len);
  }
  char* p;
  size_t len;
};

class UringTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_EQ(UringProbe(), 0);
    registrar_ = MakeUringRegistrar();
    ASSERT_NE(registrar_, nullptr);
    int err = -1;
    domain_.reset(registrar_->OpenDomain(nullptr, 0, &err));
    ASSERT_EQ(err, 0);
    ASSERT_NE(domain_, nullptr);
    ASSERT_NE(buf_.p, nullptr);
  }

  std::unique_ptr<Registrar> registrar_;
  std::unique_ptr<Domain> domain_;
  Mapping buf_{kBufBytes};
};

TEST_F(UringTest, ProbeAndRegistrarProperties) {
  EXPECT_EQ(UringProbe(), 0);
  EXPECT_STREQ(registrar_->name(), "uring");
  EXPECT_TRUE(registrar_->hook_safe());
  EXPECT_NE(domain_->handle(), nullptr);
}

TEST_F(UringTest, RegisterGivesOneSlotWithEqualKeys) {
  Registration reg;
  reg.handle = &reg;  // must be overwritten
  ASSERT_EQ(domain_->Register(buf_.p, kBufBytes, &reg), 0);
  EXPECT_EQ(reg.lkey, reg.rkey);
  EXPECT_EQ(reg.lkey, 0u);  // first slot of a fresh ring
  EXPECT_EQ(reg.slots, 1u);
  EXPECT_EQ(reg.key_shift, 30u);
  EXPECT_EQ(reg.handle, nullptr);
  EXPECT_EQ(domain_->Deregister(buf_.p, kBufBytes, reg), 0);
}

TEST_F(UringTest, DmaBothDirections) {
  Registration reg;
  ASSERT_EQ(domain_->Register(buf_.p, kBufBytes, &reg), 0);

  // Small transfer at the start.
  std::vector<uint8_t> src(4096), dst(4096);
  Fill(src.data(), src.size(), 1);
  ASSERT_EQ(domain_->DmaWrite(reg, buf_.p, buf_.p, src.data(), src.size()), 0);
  EXPECT_TRUE(Has(buf_.p, src.size(), 1));

  Fill(buf_.p + 8192, 4096, 2);
  ASSERT_EQ(domain_->DmaRead(reg, buf_.p, buf_.p + 8192, dst.data(), dst.size()), 0);
  EXPECT_TRUE(Has(dst.data(), dst.size(), 2));

  // The whole buffer: several trips through the 1 MiB wire.
  std::vector<uint8_t> big(kBufBytes), back(kBufBytes);
  Fill(big.data(), big.size(), 3);
  ASSERT_EQ(domain_->DmaWrite(reg, buf_.p, buf_.p, big.data(), big.size()), 0);
  EXPECT_TRUE(Has(buf_.p, kBufBytes, 3));
  Fill(buf_.p, kBufBytes, 4);
  ASSERT_EQ(domain_->DmaRead(reg, buf_.p, buf_.p, back.data(), back.size()), 0);
  EXPECT_TRUE(Has(back.data(), back.size(), 4));

  EXPECT_EQ(domain_->Deregister(buf_.p, kBufBytes, reg), 0);
}

TEST_F(UringTest, DmaNearTheEndOfTheBuffer) {
  Registration reg;
  ASSERT_EQ(domain_->Register(buf_.p, kBufBytes, &reg), 0);
  const size_t n = 100;
  char* at = buf_.p + kBufBytes - n;  // ends on the last byte
  memset(buf_.p + kBufBytes - 2 * n, 0x5a, n);
  std::vector<uint8_t> src(n), dst(n);
  Fill(src.data(), n, 5);
  ASSERT_EQ(domain_->DmaWrite(reg, buf_.p, at, src.data(), n), 0);
  EXPECT_TRUE(Has(at, n, 5));
  for (size_t i = 0; i < n; i++) ASSERT_EQ(buf_.p[kBufBytes - 2 * n + i], 0x5a) << i;  // untouched
  Fill(at, n, 6);
  ASSERT_EQ(domain_->DmaRead(reg, buf_.p, at, dst.data(), n), 0);
  EXPECT_TRUE(Has(dst.data(), n, 6));
  EXPECT_EQ(domain_->Deregister(buf_.p, kBufBytes, reg), 0);
}

TEST_F(UringTest, DmaAfterDeregisterFails) {
  Registration reg;
  ASSERT_EQ(domain_->Register(buf_.p, kBufBytes, &reg), 0);
  ASSERT_EQ(domain_->Deregister(buf_.p, kBufBytes, reg), 0);
  char dst[64];
  EXPECT_NE(domain_->DmaRead(reg, buf_.p, buf_.p, dst, sizeof dst), 0);
  char src[64] = {1};
  EXPECT_NE(domain_->DmaWrite(reg, buf_.p, buf_.p, src, sizeof src), 0);
}

TEST_F(UringTest, FreedSlotIsReused) {
  Mapping other(kBufBytes);
  ASSERT_NE(other.p, nullptr);
  Registration a, b, c;
  ASSERT_EQ(domain_->Register(buf_.p, kBufBytes, &a), 0);
  ASSERT_EQ(domain_->Register(other.p, kBufBytes, &b), 0);
  EXPECT_NE(a.lkey, b.lkey);
  ASSERT_EQ(domain_->Deregister(buf_.p, kBufBytes, a), 0);
  ASSERT_EQ(domain_->Register(buf_.p, kBufBytes, &c), 0);
  EXPECT_EQ(c.lkey, a.lkey);
  // Both live registrations move data to the right buffer.
  uint8_t x[16];
  Fill(x, sizeof x, 7);
  ASSERT_EQ(domain_->DmaWrite(b, other.p, other.p, x, sizeof x), 0);
  EXPECT_TRUE(Has(other.p, sizeof x, 7));
  Fill(x, sizeof x, 8);
  ASSERT_EQ(domain_->DmaWrite(c, buf_.p, buf_.p, x, sizeof x), 0);
  EXPECT_TRUE(Has(buf_.p, sizeof x, 8));
  EXPECT_TRUE(Has(other.p, sizeof x, 7));
  EXPECT_EQ(domain_->Deregister(buf_.p, kBufBytes, c), 0);
  EXPECT_EQ(domain_->Deregister(other.p, kBufBytes, b), 0);
}

TEST_F(UringTest, VmPinFollowsRegistration) {
  const long before = VmPinKb();
  ASSERT_GE(before, 0) << "no VmPin in /proc/self/status";
  Registration reg;
  ASSERT_EQ(domain_->Register(buf_.p, kBufBytes, &reg), 0);
  const long want = before + static_cast<long>(kBufBytes >> 10);
  long during = WaitForVmPin([&](long kb) { return kb >= want; });
  EXPECT_GE(during, want);
  EXPECT_LE(during, want + 64) << "pinned far more than the buffer";
  ASSERT_EQ(domain_->Deregister(buf_.p, kBufBytes, reg), 0);
  long after = WaitForVmPin([&](long kb) { return kb <= before; });
  EXPECT_EQ(after, before);
}

// Negative control: after MADV_DONTNEED the CPU gets fresh pages, but the
// registration still holds the old pinned ones. DMA must see the old bytes,
// proving it goes through the pin and not through the current mapping.
TEST_F(UringTest, DmaUsesPinnedPagesNotTheCurrentMapping) {
  const size_t n = 64 << 10;
  Fill(buf_.p, n, 10);
  Registration reg;
  ASSERT_EQ(domain_->Register(buf_.p, kBufBytes, &reg), 0);
  ASSERT_EQ(madvise(buf_.p, kBufBytes, MADV_DONTNEED), 0);
  EXPECT_EQ(buf_.p[0], 0);  // the CPU now sees a fresh zero page
  Fill(buf_.p, n, 11);

  std::vector<uint8_t> dst(n);
  ASSERT_EQ(domain_->DmaRead(reg, buf_.p, buf_.p, dst.data(), n), 0);
  EXPECT_FALSE(Has(dst.data(), n, 11)) << "DMA read the CPU's new pages";
  EXPECT_TRUE(Has(dst.data(), n, 10)) << "DMA should read the pinned pages";

  // And the other way: a DMA write lands in the pinned pages, not the CPU's.
  std::vector<uint8_t> src(n);
  Fill(src.data(), n, 12);
  ASSERT_EQ(domain_->DmaWrite(reg, buf_.p, buf_.p, src.data(), n), 0);
  EXPECT_TRUE(Has(buf_.p, n, 11));
  EXPECT_FALSE(Has(buf_.p, n, 12));
  EXPECT_EQ(domain_->Deregister(buf_.p, kBufBytes, reg), 0);
}

// Child exit codes, so the parent can say which step failed.
enum ChildStatus { kChildOk = 0, kChildMmap = 10, kChildRegister, kChildSlot, kChildWrite,
                   kChildWriteData, kChildRead, kChildReadData, kChildDeregister };

TEST_F(UringTest, ForgetAfterForkReopensInTheChild) {
  Registration reg;
  ASSERT_EQ(domain_->Register(buf_.p, kBufBytes, &reg), 0);
  ASSERT_EQ(reg.lkey, 0u);
  uint8_t x[256];
  Fill(x, sizeof x, 20);
  ASSERT_EQ(domain_->DmaWrite(reg, buf_.p, buf_.p, x, sizeof x), 0);
  ASSERT_TRUE(Has(buf_.p, sizeof x, 20));

  fflush(nullptr);
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    // Child: no gtest assertions here; report through the exit code.
    domain_->ForgetAfterFork();
    const size_t n = 64 << 10;
    void* m = mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) _exit(kChildMmap);
    char* p = static_cast<char*>(m);
    Registration r;
    if (domain_->Register(p, n, &r) != 0) _exit(kChildRegister);
    // A new ring has an empty slot table; the parent's holds slot 0.
    if (r.lkey != 0) _exit(kChildSlot);
    uint8_t y[256];
    Fill(y, sizeof y, 21);
    if (domain_->DmaWrite(r, p, p, y, sizeof y) != 0) _exit(kChildWrite);
    if (!Has(p, sizeof y, 21)) _exit(kChildWriteData);
    Fill(p, sizeof y, 22);
    if (domain_->DmaRead(r, p, p, y, sizeof y) != 0) _exit(kChildRead);
    if (!Has(y, sizeof y, 22)) _exit(kChildReadData);
    // Clears slot 0 of the child's ring; must not touch the parent's slot 0.
    if (domain_->Deregister(p, n, r) != 0) _exit(kChildDeregister);
    _exit(kChildOk);
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status)) << "child died, status " << status;
  EXPECT_EQ(WEXITSTATUS(status), kChildOk);

  // The parent's registration is intact.
  Fill(x, sizeof x, 23);
  ASSERT_EQ(domain_->DmaWrite(reg, buf_.p, buf_.p, x, sizeof x), 0);
  EXPECT_TRUE(Has(buf_.p, sizeof x, 23));
  Fill(buf_.p + 4096, sizeof x, 24);
  ASSERT_EQ(domain_->DmaRead(reg, buf_.p, buf_.p + 4096, x, sizeof x), 0);
  EXPECT_TRUE(Has(x, sizeof x, 24));
  EXPECT_EQ(domain_->Deregister(buf_.p, kBufBytes, reg), 0);
}

}  // namespace
}  // namespace rdmalloc
