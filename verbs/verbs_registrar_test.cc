#include "verbs/verbs_registrar.h"

#include <dlfcn.h>
#include <errno.h>
#include <gtest/gtest.h>
#include <infiniband/verbs.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <deque>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "allocator/lock_order.h"
#include "allocator/mutex.h"

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

  // The data path (only with DataPathApi()). Every MR is its own object then,
  // with its access flags, so the fake NIC can check keys and rights.
  bool mr_pool = false;
  std::deque<ibv_mr> mrs;
  std::deque<int> mr_access;
  ibv_port_attr port = {};
  int query_port_rc = 0;
  ibv_gid gids[4] = {};
  ibv_cq cq = {};
  ibv_qp qp = {};
  int create_cq_errno = 0;
  int create_qp_errno = 0;
  int modify_fails_at = -1;  // this target state fails with EINVAL
  int post_rc = 0;
  bool never_complete = false;
  int force_status = -1;  // the next completion gets this status
  int cq_creates = 0, cq_destroys = 0, qp_creates = 0, qp_destroys = 0;
  ibv_qp_init_attr qp_init = {};
  std::vector<ibv_qp_attr> modifies;
  std::vector<int> modify_masks;
  int qp_state = IBV_QPS_RESET;
  struct Posted {
    ibv_wr_opcode opcode;
    uint64_t remote;
    uint32_t rkey;
    uint64_t local;
    uint32_t length;
    uint32_t lkey;
    bool signaled;
  };
  std::vector<Posted> posted;
  std::deque<ibv_wc> cqes;
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
  g->pd.context = ctx;
  return &g->pd;
}
int FakeDeallocPd(ibv_pd* pd) {
  g->calls.push_back("dealloc_pd");
  g->dealloced = pd;
  return 0;
}
ibv_mr* FakeRegMr(ibv_pd* pd, void* addr, size_t length, int access) {
  witness::CallingJemalloc();  // libibverbs mallocs here
  g->calls.push_back("reg_mr");
  g->reg_pd = pd;
  g->reg_addr = addr;
  g->reg_len = length;
  g->reg_access = access;
  if (g->reg_mr_fails) {
    if (g->reg_mr_errno != 0) errno = g->reg_mr_errno;
    return nullptr;
  }
  if (g->mr_pool) {
    ibv_mr& mr = g->mrs.emplace_back();
    mr.pd = pd;
    mr.addr = addr;
    mr.length = length;
    mr.lkey = 0x100 + static_cast<uint32_t>(g->mrs.size());
    mr.rkey = 0x200 + static_cast<uint32_t>(g->mrs.size());
    g->mr_access.push_back(access);
    return &mr;
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

// ---- The fake data path: a NIC that moves bytes with memcpy.

// The live MR with this key covering [addr, addr+len), and its access flags.
const ibv_mr* FindMr(uint32_t key, bool remote, uint64_t addr, uint64_t len, int* access) {
  for (size_t i = 0; i < g->mrs.size(); i++) {
    const ibv_mr& mr = g->mrs[i];
    if ((remote ? mr.rkey : mr.lkey) != key) continue;
    auto base = reinterpret_cast<uint64_t>(mr.addr);
    if (addr < base || addr + len > base + mr.length) return nullptr;
    *access = g->mr_access[i];
    return &mr;
  }
  return nullptr;
}

ibv_cq* FakeCreateCq(ibv_context* ctx, int cqe, void*, ibv_comp_channel*, int) {
  g->calls.push_back("create_cq");
  EXPECT_EQ(ctx, &g->ctx);
  EXPECT_GE(cqe, 1);
  if (g->create_cq_errno != 0) {
    errno = g->create_cq_errno;
    return nullptr;
  }
  g->cq_creates++;
  g->cq.context = ctx;
  g->cqes.clear();
  return &g->cq;
}
int FakeDestroyCq(ibv_cq* cq) {
  g->calls.push_back("destroy_cq");
  EXPECT_EQ(cq, &g->cq);
  g->cq_destroys++;
  return 0;
}
ibv_qp* FakeCreateQp(ibv_pd* pd, ibv_qp_init_attr* attr) {
  witness::CallingJemalloc();  // libibverbs mallocs here
  g->calls.push_back("create_qp");
  EXPECT_EQ(pd, &g->pd);
  if (g->create_qp_errno != 0) {
    errno = g->create_qp_errno;
    return nullptr;
  }
  g->qp_creates++;
  g->qp_init = *attr;
  g->qp.pd = pd;
  g->qp.context = pd->context;
  g->qp.qp_num = 40 + g->qp_creates;
  g->qp_state = IBV_QPS_RESET;
  return &g->qp;
}
int FakeDestroyQp(ibv_qp* qp) {
  g->calls.push_back("destroy_qp");
  EXPECT_EQ(qp, &g->qp);
  g->qp_destroys++;
  g->qp_state = IBV_QPS_RESET;
  return 0;
}
int FakeModifyQp(ibv_qp* qp, ibv_qp_attr* attr, int mask) {
  g->calls.push_back("modify_qp " + std::to_string(attr->qp_state));
  EXPECT_EQ(qp, &g->qp);
  EXPECT_TRUE(mask & IBV_QP_STATE);
  g->modifies.push_back(*attr);
  g->modify_masks.push_back(mask);
  if (static_cast<int>(attr->qp_state) == g->modify_fails_at) return EINVAL;
  g->qp_state = attr->qp_state;
  return 0;
}
int FakeQueryPort(ibv_context* ctx, uint8_t port, ibv_port_attr* attr) {
  g->calls.push_back("query_port");
  EXPECT_EQ(ctx, &g->ctx);
  EXPECT_EQ(port, 1);
  if (g->query_port_rc != 0) return g->query_port_rc;
  *attr = g->port;
  return 0;
}
int FakeQueryGid(ibv_context* ctx, uint8_t port, int index, ibv_gid* gid) {
  g->calls.push_back("query_gid " + std::to_string(index));
  EXPECT_EQ(ctx, &g->ctx);
  EXPECT_EQ(port, 1);
  if (index < 0 || index >= 4) return EINVAL;
  *gid = g->gids[index];
  return 0;
}
int FakePostSend(ibv_qp* qp, ibv_send_wr* wr, ibv_send_wr** bad) {
  g->calls.push_back("post_send");
  EXPECT_EQ(qp, &g->qp);
  if (g->post_rc != 0) {
    *bad = wr;
    return g->post_rc;
  }
  if (g->qp_state != IBV_QPS_RTS) {
    ADD_FAILURE() << "post_send on a QP in state " << g->qp_state;
    *bad = wr;
    return EINVAL;
  }
  EXPECT_EQ(wr->next, nullptr);
  EXPECT_EQ(wr->num_sge, 1);
  const ibv_sge& sge = wr->sg_list[0];
  g->posted.push_back({wr->opcode, wr->wr.rdma.remote_addr, wr->wr.rdma.rkey, sge.addr,
                       sge.length, sge.lkey, (wr->send_flags & IBV_SEND_SIGNALED) != 0});
  if (g->never_complete) return 0;
  ibv_wc wc = {};
  wc.wr_id = wr->wr_id;
  wc.qp_num = qp->qp_num;
  wc.opcode = wr->opcode == IBV_WR_RDMA_WRITE ? IBV_WC_RDMA_WRITE : IBV_WC_RDMA_READ;
  bool write = wr->opcode == IBV_WR_RDMA_WRITE;
  int local_access = 0, remote_access = 0;
  if (g->force_status >= 0) {
    wc.status = static_cast<ibv_wc_status>(g->force_status);
    g->force_status = -1;
  } else if (FindMr(sge.lkey, false, sge.addr, sge.length, &local_access) == nullptr ||
             (!write && !(local_access & IBV_ACCESS_LOCAL_WRITE))) {
    wc.status = IBV_WC_LOC_PROT_ERR;
  } else if (FindMr(wr->wr.rdma.rkey, true, wr->wr.rdma.remote_addr, sge.length,
                    &remote_access) == nullptr ||
             !(remote_access & (write ? IBV_ACCESS_REMOTE_WRITE : IBV_ACCESS_REMOTE_READ))) {
    wc.status = IBV_WC_REM_ACCESS_ERR;
  } else {
    auto* local = reinterpret_cast<void*>(sge.addr);
    auto* remote = reinterpret_cast<void*>(wr->wr.rdma.remote_addr);
    if (write) {
      memcpy(remote, local, sge.length);
    } else {
      memcpy(local, remote, sge.length);
    }
    wc.status = IBV_WC_SUCCESS;
    wc.byte_len = sge.length;
  }
  if (wc.status != IBV_WC_SUCCESS) g->qp_state = IBV_QPS_ERR;
  g->cqes.push_back(wc);
  return 0;
}
int FakePollCq(ibv_cq* cq, int n, ibv_wc* wc) {
  EXPECT_EQ(cq, &g->cq);
  EXPECT_GE(n, 1);
  if (g->cqes.empty()) return 0;
  *wc = g->cqes.front();
  g->cqes.pop_front();
  g->calls.push_back("poll_cq");
  return 1;
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

// FakeApi() with the data path (a loopback QP) filled in.
VerbsApi DataPathApi() {
  VerbsApi api = FakeApi();
  api.create_cq = FakeCreateCq;
  api.destroy_cq = FakeDestroyCq;
  api.create_qp = FakeCreateQp;
  api.destroy_qp = FakeDestroyQp;
  api.modify_qp = FakeModifyQp;
  api.query_port = FakeQueryPort;
  api.query_gid = FakeQueryGid;
  api.post_send = FakePostSend;
  api.poll_cq = FakePollCq;
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

// The data path: a loopback RC QP per domain, made on the first DMA.
class DataPathTest : public VerbsTest {
 protected:
  static constexpr size_t kStaging = size_t{1} << 20;

  void SetUp() override {
    VerbsTest::SetUp();
    g->mr_pool = true;
    g->port.state = IBV_PORT_ACTIVE;
    g->port.active_mtu = IBV_MTU_1024;
    g->port.max_mtu = IBV_MTU_4096;
    g->port.link_layer = IBV_LINK_LAYER_ETHERNET;
    g->port.gid_tbl_len = 4;
    g->port.max_msg_sz = 1u << 31;
    for (int i = 0; i < 16; i++) g->gids[0].raw[i] = static_cast<uint8_t>(0xf0 + i);
  }

  std::unique_ptr<Domain> Open(int access = kAccess, VerbsApi api = DataPathApi()) {
    auto registrar = MakeVerbsRegistrar(api, nullptr);
    int err = -1;
    std::unique_ptr<Domain> d(registrar->OpenDomain(nullptr, access, &err));
    EXPECT_EQ(err, 0);
    return d;
  }

  // The staging MR: registered LOCAL_WRITE only, 1 MiB.
  const ibv_mr* Staging() const {
    for (size_t i = 0; i < g->mrs.size(); i++)
      if (g->mr_access[i] == IBV_ACCESS_LOCAL_WRITE && g->mrs[i].length == kStaging)
        return &g->mrs[i];
    return nullptr;
  }

  int Count(const std::string& call) const {
    return static_cast<int>(std::count(g->calls.begin(), g->calls.end(), call));
  }
};

TEST_F(DataPathTest, NothingIsMadeBeforeTheFirstDma) {
  auto d = Open();
  ASSERT_NE(d, nullptr);
  std::vector<uint8_t> region(1 << 16);
  Registration reg;
  ASSERT_EQ(d->Register(region.data(), region.size(), &reg), 0);
  ASSERT_EQ(d->Deregister(region.data(), region.size(), reg), 0);
  EXPECT_EQ(g->calls, (Calls{"get_device_list", "open_device", "free_device_list", "alloc_pd",
                             "reg_mr", "dereg_mr"}))
      << "no CQ, QP or staging buffer from the constructor or Register/Deregister";
}

TEST_F(DataPathTest, FirstDmaConnectsAnRcQpToItself) {
  auto d = Open();
  ASSERT_NE(d, nullptr);
  std::vector<uint8_t> region(1 << 16), src(100, 7);
  Registration reg;
  ASSERT_EQ(d->Register(region.data(), region.size(), &reg), 0);
  g->calls.clear();
  ASSERT_EQ(d->DmaWrite(reg, region.data(), region.data() + 10, src.data(), src.size()), 0);
  EXPECT_EQ(g->calls,
            (Calls{"reg_mr", "query_port", "query_gid 0", "create_cq", "create_qp",
                   "modify_qp " + std::to_string(IBV_QPS_INIT),
                   "modify_qp " + std::to_string(IBV_QPS_RTR),
                   "modify_qp " + std::to_string(IBV_QPS_RTS), "post_send", "poll_cq"}));
  // Staging: 1 MiB, LOCAL_WRITE, same PD.
  const ibv_mr* staging = Staging();
  ASSERT_NE(staging, nullptr);
  EXPECT_EQ(staging->pd, &g->pd);
  // QP: RC, one CQ for both queues, room for a WR and one SGE.
  EXPECT_EQ(g->qp_init.qp_type, IBV_QPT_RC);
  EXPECT_EQ(g->qp_init.send_cq, &g->cq);
  EXPECT_EQ(g->qp_init.recv_cq, &g->cq);
  EXPECT_GE(g->qp_init.cap.max_send_wr, 1u);
  EXPECT_GE(g->qp_init.cap.max_send_sge, 1u);
  ASSERT_EQ(g->modifies.size(), 3u);
  const ibv_qp_attr& init = g->modifies[0];
  EXPECT_EQ(init.port_num, 1);
  EXPECT_TRUE(g->modify_masks[0] & IBV_QP_ACCESS_FLAGS);
  EXPECT_EQ(init.qp_access_flags & (IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE),
            IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE);
  const ibv_qp_attr& rtr = g->modifies[1];
  EXPECT_EQ(rtr.dest_qp_num, g->qp.qp_num) << "connected to itself";
  EXPECT_EQ(rtr.path_mtu, IBV_MTU_1024) << "the port's active MTU";
  EXPECT_GE(rtr.max_dest_rd_atomic, 1);
  EXPECT_EQ(rtr.ah_attr.port_num, 1);
  EXPECT_EQ(rtr.ah_attr.is_global, 1) << "RoCE: a GRH";
  EXPECT_EQ(rtr.ah_attr.grh.sgid_index, 0);
  EXPECT_EQ(memcmp(rtr.ah_attr.grh.dgid.raw, g->gids[0].raw, 16), 0);
  const ibv_qp_attr& rts = g->modifies[2];
  EXPECT_GE(rts.max_rd_atomic, 1) << "RDMA READ needs an initiator depth";
  EXPECT_EQ(rts.sq_psn, rtr.rq_psn);
  // The WR: signaled WRITE from the staging MR to the region's rkey.
  ASSERT_EQ(g->posted.size(), 1u);
  const Fake::Posted& w = g->posted[0];
  EXPECT_EQ(w.opcode, IBV_WR_RDMA_WRITE);
  EXPECT_TRUE(w.signaled);
  EXPECT_EQ(w.rkey, reg.rkey);
  EXPECT_EQ(w.remote, reinterpret_cast<uint64_t>(region.data() + 10));
  EXPECT_EQ(w.lkey, staging->lkey);
  EXPECT_EQ(w.local, reinterpret_cast<uint64_t>(staging->addr));
  EXPECT_EQ(w.length, 100u);
  EXPECT_EQ(std::count(region.begin() + 10, region.begin() + 110, 7), 100);
  EXPECT_EQ(std::count(region.begin(), region.end(), 7), 100);

  // Made once: the next transfers only post and poll.
  g->calls.clear();
  std::vector<uint8_t> back(100);
  ASSERT_EQ(d->DmaRead(reg, region.data(), region.data() + 10, back.data(), back.size()), 0);
  EXPECT_EQ(back, src);
  EXPECT_EQ(g->calls, (Calls{"post_send", "poll_cq"}));
  EXPECT_EQ(g->posted.back().opcode, IBV_WR_RDMA_READ);
}

TEST_F(DataPathTest, TheFirstValidGidIsUsedWhenIndexZeroIsEmpty) {
  memset(&g->gids[0], 0, sizeof g->gids[0]);
  g->gids[2].raw[15] = 1;
  auto d = Open();
  std::vector<uint8_t> region(4096);
  Registration reg;
  ASSERT_EQ(d->Register(region.data(), region.size(), &reg), 0);
  char byte = 1;
  ASSERT_EQ(d->DmaWrite(reg, region.data(), region.data(), &byte, 1), 0);
  ASSERT_EQ(g->modifies.size(), 3u);
  EXPECT_EQ(g->modifies[1].ah_attr.grh.sgid_index, 2);
  EXPECT_EQ(g->modifies[1].ah_attr.grh.dgid.raw[15], 1);
}

TEST_F(DataPathTest, NoGidOnRoceIsAnError) {
  memset(&g->gids[0], 0, sizeof g->gids[0]);
  auto d = Open();
  std::vector<uint8_t> region(4096);
  Registration reg;
  ASSERT_EQ(d->Register(region.data(), region.size(), &reg), 0);
  char byte = 1;
  EXPECT_EQ(d->DmaWrite(reg, region.data(), region.data(), &byte, 1), EADDRNOTAVAIL);
  EXPECT_EQ(g->qp_creates, 0);
}

TEST_F(DataPathTest, InfiniBandPortUsesItsLid) {
  g->port.link_layer = IBV_LINK_LAYER_INFINIBAND;
  g->port.lid = 0x17;
  auto d = Open();
  std::vector<uint8_t> region(4096);
  Registration reg;
  ASSERT_EQ(d->Register(region.data(), region.size(), &reg), 0);
  char byte = 1;
  ASSERT_EQ(d->DmaWrite(reg, region.data(), region.data(), &byte, 1), 0);
  ASSERT_EQ(g->modifies.size(), 3u);
  EXPECT_EQ(g->modifies[1].ah_attr.dlid, 0x17);
  EXPECT_EQ(g->modifies[1].ah_attr.is_global, 0);
}

TEST_F(DataPathTest, LargeTransfersGoInStagingSizedChunks) {
  const size_t n = 3 * kStaging + 123;
  std::vector<uint8_t> region(n + 4096), src(n), back(n);
  for (size_t i = 0; i < n; i++) src[i] = static_cast<uint8_t>(i * 7 + i / 251);
  auto d = Open();
  Registration reg;
  ASSERT_EQ(d->Register(region.data(), region.size(), &reg), 0);
  uint8_t* at = region.data() + 1000;
  ASSERT_EQ(d->DmaWrite(reg, region.data(), at, src.data(), n), 0);
  EXPECT_EQ(memcmp(at, src.data(), n), 0);
  ASSERT_EQ(g->posted.size(), 4u);
  uint64_t expect_remote = reinterpret_cast<uint64_t>(at);
  for (const Fake::Posted& w : g->posted) {
    EXPECT_EQ(w.opcode, IBV_WR_RDMA_WRITE);
    EXPECT_EQ(w.remote, expect_remote);
    EXPECT_LE(w.length, kStaging);
    expect_remote += w.length;
  }
  EXPECT_EQ(expect_remote, reinterpret_cast<uint64_t>(at) + n);
  g->posted.clear();
  ASSERT_EQ(d->DmaRead(reg, region.data(), at, back.data(), n), 0);
  EXPECT_EQ(back, src);
  EXPECT_EQ(g->posted.size(), 4u);
  EXPECT_EQ(g->qp_creates, 1);
}

TEST_F(DataPathTest, MissingRemoteAccessIsEACCESAndTheQpIsRemade) {
  // The MR allows remote writes but not reads: the NIC refuses the READ.
  auto d = Open(IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  std::vector<uint8_t> region(8192), buf(100, 3);
  Registration reg;
  ASSERT_EQ(d->Register(region.data(), region.size(), &reg), 0);
  ASSERT_EQ(d->DmaWrite(reg, region.data(), region.data(), buf.data(), buf.size()), 0);
  EXPECT_EQ(d->DmaRead(reg, region.data(), region.data(), buf.data(), buf.size()), EACCES);
  EXPECT_EQ(g->qp_destroys, 1) << "a QP in the error state is replaced";
  EXPECT_EQ(g->cq_destroys, 1);
  ASSERT_EQ(d->DmaWrite(reg, region.data(), region.data() + 200, buf.data(), buf.size()), 0);
  EXPECT_EQ(g->qp_creates, 2);
  EXPECT_EQ(region[250], 3);

  // Local access only: the WRITE is refused as well, memory untouched.
  auto local = Open(IBV_ACCESS_LOCAL_WRITE);
  std::vector<uint8_t> other(4096, 9);
  Registration lreg;
  ASSERT_EQ(local->Register(other.data(), other.size(), &lreg), 0);
  EXPECT_EQ(local->DmaWrite(lreg, other.data(), other.data(), buf.data(), buf.size()), EACCES);
  EXPECT_EQ(std::count(other.begin(), other.end(), 9), 4096);
}

TEST_F(DataPathTest, OtherCompletionErrorsAreEIO) {
  auto d = Open();
  std::vector<uint8_t> region(4096), buf(16);
  Registration reg;
  ASSERT_EQ(d->Register(region.data(), region.size(), &reg), 0);
  for (int status : {IBV_WC_RETRY_EXC_ERR, IBV_WC_LOC_PROT_ERR, IBV_WC_WR_FLUSH_ERR,
                     IBV_WC_REM_INV_REQ_ERR}) {
    SCOPED_TRACE(status);
    g->force_status = status;
    EXPECT_EQ(d->DmaRead(reg, region.data(), region.data(), buf.data(), buf.size()), EIO);
    EXPECT_EQ(d->DmaRead(reg, region.data(), region.data(), buf.data(), buf.size()), 0)
        << "the next transfer works on a new QP";
  }
  EXPECT_EQ(g->qp_creates, 5);
  EXPECT_EQ(g->qp_destroys, 4);
}

TEST_F(DataPathTest, NoCompletionTimesOut) {
  VerbsApi api = DataPathApi();
  api.dma_timeout_ms = 50;
  auto d = Open(kAccess, api);
  std::vector<uint8_t> region(4096), buf(16);
  Registration reg;
  ASSERT_EQ(d->Register(region.data(), region.size(), &reg), 0);
  g->never_complete = true;
  auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(d->DmaWrite(reg, region.data(), region.data(), buf.data(), buf.size()), ETIMEDOUT);
  auto waited = std::chrono::steady_clock::now() - t0;
  EXPECT_GE(waited, std::chrono::milliseconds(50));
  EXPECT_LT(waited, std::chrono::seconds(5));
  EXPECT_EQ(g->qp_destroys, 1) << "the request in flight is cancelled with its QP";
  g->never_complete = false;
  EXPECT_EQ(d->DmaWrite(reg, region.data(), region.data(), buf.data(), buf.size()), 0);
}

TEST_F(DataPathTest, SetUpFailuresAreReturnedAndCleanedUp) {
  std::vector<uint8_t> region(4096), buf(16);
  // A fresh domain with one registered region: the first transfer sets the
  // data path up, so the failure injected before it shows in its result.
  struct Fixture {
    std::unique_ptr<Domain> d;
    Registration reg;
  };
  auto fresh = [&]() {
    Fixture f{Open(), {}};
    EXPECT_EQ(f.d->Register(region.data(), region.size(), &f.reg), 0);
    return f;
  };
  auto write = [&](Fixture& f) {
    return f.d->DmaWrite(f.reg, region.data(), region.data(), buf.data(), buf.size());
  };
  {
    g->port.state = IBV_PORT_DOWN;
    Fixture f = fresh();
    EXPECT_EQ(write(f), ENETDOWN);
    g->port.state = IBV_PORT_ACTIVE;
    EXPECT_EQ(write(f), 0) << "tried again on the next transfer";
  }
  SetUp();
  {
    g->query_port_rc = EIO;
    Fixture f = fresh();
    EXPECT_EQ(write(f), EIO);
  }
  SetUp();
  {
    g->create_cq_errno = ENOMEM;
    Fixture f = fresh();
    EXPECT_EQ(write(f), ENOMEM);
  }
  SetUp();
  {
    g->create_qp_errno = EPERM;
    Fixture f = fresh();
    EXPECT_EQ(write(f), EPERM);
    EXPECT_EQ(g->cq_destroys, 1) << "the CQ made for it is destroyed";
  }
  for (int state : {IBV_QPS_INIT, IBV_QPS_RTR, IBV_QPS_RTS}) {
    SCOPED_TRACE(state);
    SetUp();
    g->modify_fails_at = state;
    Fixture f = fresh();
    EXPECT_EQ(write(f), EINVAL);
    EXPECT_EQ(g->qp_destroys, 1);
    EXPECT_EQ(g->cq_destroys, 1);
  }
  SetUp();
  {
    Fixture f = fresh();
    g->post_rc = ENOMEM;
    EXPECT_EQ(write(f), ENOMEM);
    g->post_rc = 0;
    EXPECT_EQ(write(f), 0);
  }
  SetUp();
  {
    Fixture f = fresh();
    g->reg_mr_fails = true;  // the staging buffer cannot be registered
    g->reg_mr_errno = ENOMEM;
    EXPECT_EQ(write(f), ENOMEM);
    EXPECT_EQ(g->qp_creates, 0);
  }
}

TEST_F(DataPathTest, DestroyingTheDomainFreesTheDataPathFirst) {
  auto d = Open();
  std::vector<uint8_t> region(4096), buf(16);
  Registration reg;
  ASSERT_EQ(d->Register(region.data(), region.size(), &reg), 0);
  ASSERT_EQ(d->DmaWrite(reg, region.data(), region.data(), buf.data(), buf.size()), 0);
  ASSERT_EQ(d->Deregister(region.data(), region.size(), reg), 0);
  const ibv_mr* staging = Staging();
  g->calls.clear();
  d.reset();
  EXPECT_EQ(g->calls,
            (Calls{"destroy_qp", "destroy_cq", "dereg_mr", "dealloc_pd", "close_device"}));
  EXPECT_EQ(g->dereged, staging);
}

TEST_F(DataPathTest, AForkChildDropsTheDataPathWithoutTouchingIt) {
  auto d = Open();
  std::vector<uint8_t> region(4096), buf(16);
  Registration reg;
  ASSERT_EQ(d->Register(region.data(), region.size(), &reg), 0);
  ASSERT_EQ(d->DmaWrite(reg, region.data(), region.data(), buf.data(), buf.size()), 0);
  g->calls.clear();
  d->ForgetAfterFork();
  EXPECT_EQ(d->DmaWrite(reg, region.data(), region.data(), buf.data(), buf.size()), EOPNOTSUPP);
  EXPECT_EQ(d->DmaRead(reg, region.data(), region.data(), buf.data(), buf.size()), EOPNOTSUPP);
  d.reset();
  EXPECT_TRUE(g->calls.empty()) << "called " << g->calls.front();
}

#ifdef RDMALLOC_WITNESS
// The data path's lock has its rank in the one lock order: taken under a
// region's reg_lock (Heap::Dma), held while the first transfer makes its QP
// and staging MR, which malloc (the fakes tell the witness), and never under
// a lock taken inside jemalloc. Built with the witness by
// verbs_registrar_witness_test, --config=ubsan and --config=tsan.
TEST_F(DataPathTest, TheDataPathLockKeepsItsRank) {
  auto d = Open();
  std::vector<uint8_t> region(4096), buf(16);
  Registration reg;
  ASSERT_EQ(d->Register(region.data(), region.size(), &reg), 0);
  {
    Mutex<LockRank::kRegion> reg_lock;
    LockGuard<Mutex<LockRank::kRegion>> held(reg_lock);
    EXPECT_EQ(d->DmaWrite(reg, region.data(), region.data(), buf.data(), buf.size()), 0);
  }
  EXPECT_EQ(g->qp_creates, 1);
  EXPECT_DEATH(
      {
        Mutex<LockRank::kHeap> shard_lock;
        shard_lock.Lock();
        d->DmaRead(reg, region.data(), region.data(), buf.data(), buf.size());
      },
      "taking 'verbs data path' \\(rank 6\\) while holding 'heap' \\(rank 8\\)");
}
#endif

TEST_F(DataPathTest, AnyMissingEntryPointMeansNoDataPath) {
  using Field = std::function<void(VerbsApi*)>;
  std::vector<std::pair<const char*, Field>> fields = {
      {"create_cq", [](VerbsApi* a) { a->create_cq = nullptr; }},
      {"destroy_cq", [](VerbsApi* a) { a->destroy_cq = nullptr; }},
      {"create_qp", [](VerbsApi* a) { a->create_qp = nullptr; }},
      {"destroy_qp", [](VerbsApi* a) { a->destroy_qp = nullptr; }},
      {"modify_qp", [](VerbsApi* a) { a->modify_qp = nullptr; }},
      {"query_port", [](VerbsApi* a) { a->query_port = nullptr; }},
      {"query_gid", [](VerbsApi* a) { a->query_gid = nullptr; }},
      {"post_send", [](VerbsApi* a) { a->post_send = nullptr; }},
      {"poll_cq", [](VerbsApi* a) { a->poll_cq = nullptr; }},
  };
  for (auto& [name, clear] : fields) {
    SCOPED_TRACE(name);
    SetUp();
    VerbsApi api = DataPathApi();
    clear(&api);
    auto d = Open(kAccess, api);
    std::vector<uint8_t> region(4096), buf(16);
    Registration reg;
    ASSERT_EQ(d->Register(region.data(), region.size(), &reg), 0);
    g->calls.clear();
    EXPECT_EQ(d->DmaWrite(reg, region.data(), region.data(), buf.data(), buf.size()), ENOTSUP);
    EXPECT_EQ(d->DmaRead(reg, region.data(), region.data(), buf.data(), buf.size()), ENOTSUP);
    EXPECT_TRUE(g->calls.empty());
  }
}

TEST(LoadVerbsApiTest, RealLibraryHasTheDataPath) {
  void* probe = dlopen("libibverbs.so.1", RTLD_NOW | RTLD_LOCAL);
  if (probe == nullptr) GTEST_SKIP() << "libibverbs.so.1 is not installed";
  dlclose(probe);
  VerbsApi api;
  ASSERT_EQ(LoadVerbsApi(nullptr, &api), 0);
  EXPECT_NE(api.reg_mr, nullptr);
  EXPECT_NE(api.create_cq, nullptr);
  EXPECT_NE(api.destroy_cq, nullptr);
  EXPECT_NE(api.create_qp, nullptr);
  EXPECT_NE(api.destroy_qp, nullptr);
  EXPECT_NE(api.modify_qp, nullptr);
  EXPECT_NE(api.query_port, nullptr);
  EXPECT_NE(api.query_gid, nullptr);
  EXPECT_NE(api.post_send, nullptr);
  EXPECT_NE(api.poll_cq, nullptr);
}

TEST(LoadVerbsApiTest, MissingLibraryOrRegistrationEntryPoints) {
  VerbsApi api;
  EXPECT_EQ(LoadVerbsApi("/nonexistent/libibverbs.so.1", &api), ENOENT);
  EXPECT_EQ(LoadVerbsApi("libc.so.6", &api), ENOSYS);  // no ibv_* at all
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
