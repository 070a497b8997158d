#include "verbs/verbs_registrar.h"

#include <errno.h>
#include <gtest/gtest.h>
#include <infiniband/verbs.h>

#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

namespace rdmalloc {
namespace {

// The fake libibverbs. VerbsApi holds plain function pointers, so its state
// is global and reset before every test.
struct Fake {
  // Devices.
  ibv_device devs[3] = {};
  const char* names[3] = {"mlx5_0", "mlx5_1", "rxe0"};
  ibv_device* list[4] = {};  // null-terminated, like the real one
  int ndevs = 3;
  bool list_fails = false;
  int list_errno = 0;

  // Objects handed out.
  ibv_context ctx = {};
  ibv_pd pd = {};
  ibv_mr mr = {};
  int open_errno = 0;      // non-zero: open_device fails with it
  int alloc_pd_errno = 0;  // non-zero: alloc_pd fails with it
  bool reg_mr_fails = false;
  int reg_mr_errno = 0;
  int dereg_rc = 0;

  // What was called, in order, and with what.
  std::vector<std::string> calls;
  ibv_device** freed_list = nullptr;
  ibv_device* opened = nullptr;
  ibv_context* closed = nullptr;
  ibv_context* pd_ctx = nullptr;
  ibv_pd* dealloced = nullptr;
  ibv_pd* reg_pd = nullptr;
  void* reg_addr = nullptr;
  size_t reg_len = 0;
  int reg_access = -1;
  ibv_mr* dereged = nullptr;
};
Fake* g;

ibv_device** FakeGetDeviceList(int* num) {
  g->calls.push_back("get_device_list");
  if (g->list_fails) {
    errno = g->list_errno;
    return nullptr;
  }
  *num = g->ndevs;
  return g->list;
}
void FakeFreeDeviceList(ibv_device** list) {
  g->calls.push_back("free_device_list");
  g->freed_list = list;
}
const char* FakeGetDeviceName(ibv_device* dev) {
  for (int i = 0; i < 3; i++)
    if (dev == &g->devs[i]) return g->names[i];
  ADD_FAILURE() << "get_device_name on an unknown device";
  return "";
}
ibv_context* FakeOpenDevice(ibv_device* dev) {
  g->calls.push_back("open_device");
  g->opened = dev;
  if (g->open_errno != 0) {
    errno = g->open_errno;
    return nullptr;
  }
  return &g->ctx;
}
int FakeCloseDevice(ibv_context* ctx) {
  g->calls.push_back("close_device");
  g->closed = ctx;
  return 0;
}
ibv_pd* FakeAllocPd(ibv_context* ctx) {
  g->calls.push_back("alloc_pd");
  g->pd_ctx = ctx;
  if (g->alloc_pd_errno != 0) {
    errno = g->alloc_pd_errno;
    return nullptr;
  }
  return &g->pd;
}
int FakeDeallocPd(ibv_pd* pd) {
  g->calls.push_back("dealloc_pd");
  g->dealloced = pd;
  return 0;
}
ibv_mr* FakeRegMr(ibv_pd* pd, void* addr, size_t length, int access) {
  g->calls.push_back("reg_mr");
  g->reg_pd = pd;
  g->reg_addr = addr;
  g->reg_len = length;
  g->reg_access = access;
  if (g->reg_mr_fails) {
    if (g->reg_mr_errno != 0) errno = g->reg_mr_errno;
    return nullptr;
  }
  g->mr.pd = pd;
  g->mr.addr = addr;
  g->mr.length = length;
  return &g->mr;
}
int FakeDeregMr(ibv_mr* mr) {
  g->calls.push_back("dereg_mr");
  g->dereged = mr;
  return g->dereg_rc;
}

VerbsApi FakeApi() {
  VerbsApi api;
  api.get_device_list = FakeGetDeviceList;
  api.free_device_list = FakeFreeDeviceList;
  api.get_device_name = FakeGetDeviceName;
  api.open_device = FakeOpenDevice;
  api.close_device = FakeCloseDevice;
  api.alloc_pd = FakeAllocPd;
  api.dealloc_pd = FakeDeallocPd;
  api.reg_mr = FakeRegMr;
  api.dereg_mr = FakeDeregMr;
  return api;
}

constexpr int kAccess = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE;

class VerbsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    fake_ = std::make_unique<Fake>();
    g = fake_.get();
    for (int i = 0; i < 3; i++) g->list[i] = &g->devs[i];
    g->mr.lkey = 0x1234;
    g->mr.rkey = 0xabcd;
  }
  void TearDown() override { g = nullptr; }

  // Opens the default domain (pd == nullptr) on `device`; *err gets the error.
  std::unique_ptr<Domain> OpenDefault(const char* device, int* err) {
    auto registrar = MakeVerbsRegistrar(FakeApi(), device);
    *err = -1;
    return std::unique_ptr<Domain>(registrar->OpenDomain(nullptr, kAccess, err));
  }

  std::unique_ptr<Fake> fake_;
};

using Calls = std::vector<std::string>;

TEST_F(VerbsTest, RegistrarProperties) {
  auto r = MakeVerbsRegistrar(FakeApi(), nullptr);
  EXPECT_STREQ(r->name(), "verbs");
  EXPECT_FALSE(r->hook_safe());  // ibv_reg_mr allocates
  EXPECT_TRUE(g->calls.empty());  // nothing opened until asked
}

TEST_F(VerbsTest, DefaultDomainUsesTheFirstDevice) {
  for (const char* device : {static_cast<const char*>(nullptr), ""}) {
    SCOPED_TRACE(device == nullptr ? "null" : "empty");
    SetUp();
    int err;
    auto d = OpenDefault(device, &err);
    ASSERT_NE(d, nullptr);
    EXPECT_EQ(err, 0);
    EXPECT_EQ(g->opened, &g->devs[0]);
    EXPECT_EQ(g->pd_ctx, &g->ctx);
    EXPECT_EQ(g->freed_list, g->list);
    EXPECT_EQ(d->handle(), &g->pd);
    EXPECT_EQ(g->calls, (Calls{"get_device_list", "open_device", "free_device_list", "alloc_pd"}));
  }
}

TEST_F(VerbsTest, DefaultDomainUsesTheNamedDevice) {
  for (int i = 0; i < 3; i++) {
    SCOPED_TRACE(g->names[i]);
    int err;
    auto d = OpenDefault(g->names[i], &err);
    ASSERT_NE(d, nullptr);
    EXPECT_EQ(err, 0);
    EXPECT_EQ(g->opened, &g->devs[i]);
  }
}

TEST_F(VerbsTest, UnknownDeviceNameIsENODEV) {
  for (const char* name : {"mlx5", "mlx5_00", "nope", "MLX5_0"}) {
    SCOPED_TRACE(name);
    SetUp();
    int err;
    auto d = OpenDefault(name, &err);
    EXPECT_EQ(d, nullptr);
    EXPECT_EQ(err, ENODEV);
    EXPECT_EQ(g->opened, nullptr);
    EXPECT_EQ(g->freed_list, g->list);  // the list is still freed
    EXPECT_EQ(g->calls, (Calls{"get_device_list", "free_device_list"}));
  }
}

TEST_F(VerbsTest, EmptyDeviceListIsENODEV) {
  g->ndevs = 0;
  g->list[0] = nullptr;
  int err;
  auto d = OpenDefault(nullptr, &err);
  EXPECT_EQ(d, nullptr);
  EXPECT_EQ(err, ENODEV);
  EXPECT_EQ(g->calls, (Calls{"get_device_list", "free_device_list"}));
}

TEST_F(VerbsTest, DeviceListFailurePropagates) {
  g->list_fails = true;
  g->list_errno = ENOSYS;  // e.g. no kernel support
  int err;
  auto d = OpenDefault(nullptr, &err);
  EXPECT_EQ(d, nullptr);
  EXPECT_EQ(err, ENOSYS);
  EXPECT_EQ(g->calls, (Calls{"get_device_list"}));  // nothing to free
}

TEST_F(VerbsTest, OpenDeviceFailurePropagates) {
  g->open_errno = EACCES;
  int err;
  auto d = OpenDefault("mlx5_1", &err);
  EXPECT_EQ(d, nullptr);
  EXPECT_EQ(err, EACCES);
  EXPECT_EQ(g->opened, &g->devs[1]);
  // No context was opened, so none is closed; the list is freed.
  EXPECT_EQ(g->calls, (Calls{"get_device_list", "open_device", "free_device_list"}));
}

TEST_F(VerbsTest, AllocPdFailureClosesTheDevice) {
  g->alloc_pd_errno = ENOMEM;
  int err;
  auto d = OpenDefault(nullptr, &err);
  EXPECT_EQ(d, nullptr);
  EXPECT_EQ(err, ENOMEM);
  EXPECT_EQ(g->closed, &g->ctx);
  EXPECT_EQ(g->calls,
            (Calls{"get_device_list", "open_device", "free_device_list", "alloc_pd", "close_device"}));
}

TEST_F(VerbsTest, DestroyingTheDefaultDomainFreesPdThenDevice) {
  int err;
  auto d = OpenDefault(nullptr, &err);
  ASSERT_NE(d, nullptr);
  g->calls.clear();
  d.reset();
  EXPECT_EQ(g->dealloced, &g->pd);
  EXPECT_EQ(g->closed, &g->ctx);
  EXPECT_EQ(g->calls, (Calls{"dealloc_pd", "close_device"}));
}

TEST_F(VerbsTest, AdoptedPdIsUsedAndNeverFreed) {
  ibv_pd theirs = {};
  auto registrar = MakeVerbsRegistrar(FakeApi(), "mlx5_1");
  int err = -1;
  std::unique_ptr<Domain> d(registrar->OpenDomain(&theirs, IBV_ACCESS_LOCAL_WRITE, &err));
  ASSERT_NE(d, nullptr);
  EXPECT_EQ(err, 0);
  EXPECT_EQ(d->handle(), &theirs);
  EXPECT_TRUE(g->calls.empty()) << "no device is opened for an adopted pd";

  char buf[64];
  Registration reg;
  ASSERT_EQ(d->Register(buf, sizeof buf, &reg), 0);
  EXPECT_EQ(g->reg_pd, &theirs);
  EXPECT_EQ(g->reg_access, IBV_ACCESS_LOCAL_WRITE);
  ASSERT_EQ(d->Deregister(buf, sizeof buf, reg), 0);
  d.reset();
  EXPECT_EQ(g->dealloced, nullptr);
  EXPECT_EQ(g->closed, nullptr);
  EXPECT_EQ(g->calls, (Calls{"reg_mr", "dereg_mr"}));
}

TEST_F(VerbsTest, RegisterPassesArgumentsAndReturnsKeys) {
  int err;
  auto d = OpenDefault(nullptr, &err);
  ASSERT_NE(d, nullptr);
  static char buf[1 << 16];
  Registration reg;
  reg.key_shift = 99;  // must be overwritten
  ASSERT_EQ(d->Register(buf + 4096, 8192, &reg), 0);
  EXPECT_EQ(g->reg_pd, &g->pd);
  EXPECT_EQ(g->reg_addr, buf + 4096);
  EXPECT_EQ(g->reg_len, 8192u);
  EXPECT_EQ(g->reg_access, kAccess);
  EXPECT_EQ(reg.lkey, 0x1234u);
  EXPECT_EQ(reg.rkey, 0xabcdu);
  EXPECT_EQ(reg.handle, &g->mr);
  EXPECT_EQ(reg.slots, 1u);
  EXPECT_EQ(reg.key_shift, 0u);  // one key pair for the whole region
}

TEST_F(VerbsTest, RegisterFailureReturnsErrno) {
  int err;
  auto d = OpenDefault(nullptr, &err);
  ASSERT_NE(d, nullptr);
  char buf[64];
  Registration reg;
  g->reg_mr_fails = true;
  g->reg_mr_errno = ENOMEM;
  EXPECT_EQ(d->Register(buf, sizeof buf, &reg), ENOMEM);
  g->reg_mr_errno = EFAULT;
  EXPECT_EQ(d->Register(buf, sizeof buf, &reg), EFAULT);
  // NULL without errno set is still an error, and not a stale errno.
  g->reg_mr_errno = 0;
  errno = EINTR;
  int rc = d->Register(buf, sizeof buf, &reg);
  EXPECT_NE(rc, 0);
  EXPECT_NE(rc, EINTR);
}

TEST_F(VerbsTest, DeregisterUsesTheSameMr) {
  int err;
  auto d = OpenDefault(nullptr, &err);
  ASSERT_NE(d, nullptr);
  char buf[64];
  Registration reg;
  ASSERT_EQ(d->Register(buf, sizeof buf, &reg), 0);
  EXPECT_EQ(d->Deregister(buf, sizeof buf, reg), 0);
  EXPECT_EQ(g->dereged, &g->mr);
  // dereg_mr's error comes back to the caller.
  g->dereg_rc = EBUSY;
  EXPECT_EQ(d->Deregister(buf, sizeof buf, reg), EBUSY);
}

TEST_F(VerbsTest, DmaIsNotSupported) {
  int err;
  auto d = OpenDefault(nullptr, &err);
  ASSERT_NE(d, nullptr);
  char buf[64] = {}, cpu[64] = {};
  Registration reg;
  ASSERT_EQ(d->Register(buf, sizeof buf, &reg), 0);
  EXPECT_EQ(d->DmaWrite(reg, buf, buf, cpu, sizeof cpu), ENOTSUP);
  EXPECT_EQ(d->DmaRead(reg, buf, buf, cpu, sizeof cpu), ENOTSUP);
}

TEST_F(VerbsTest, ForgetAfterForkLeavesTheParentsObjectsAlone) {
  int err;
  auto d = OpenDefault(nullptr, &err);
  ASSERT_NE(d, nullptr);
  char buf[64];
  Registration reg;
  ASSERT_EQ(d->Register(buf, sizeof buf, &reg), 0);
  g->calls.clear();

  d->ForgetAfterFork();
  Registration again;
  EXPECT_EQ(d->Register(buf, sizeof buf, &again), EOPNOTSUPP);
  EXPECT_EQ(d->Deregister(buf, sizeof buf, reg), 0);
  d.reset();  // the pd and context belong to the parent
  EXPECT_TRUE(g->calls.empty()) << "called " << g->calls.front();
}

TEST(CountRdmaDevicesTest, MatchesSysfs) {
  int n = CountRdmaDevices();
  EXPECT_GE(n, 0);
  std::error_code ec;
  if (!std::filesystem::exists("/sys/class/infiniband", ec)) {
    EXPECT_EQ(n, 0);
  } else {
    int want = 0;
    for (const auto& e : std::filesystem::directory_iterator("/sys/class/infiniband", ec)) {
      if (e.path().filename().string()[0] != '.') want++;
    }
    EXPECT_EQ(n, want);
  }
}

}  // namespace
}  // namespace rdmalloc
