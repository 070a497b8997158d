#include "verbs/verbs_registrar.h"

#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <infiniband/verbs.h>

#include <cstdio>
#include <cstring>
#include <string>

#include "allocator/mutex.h"

namespace rdmalloc {
namespace {

// Whether every data-path entry point is there.
bool HasDataPath(const VerbsApi& api) {
  return api.create_cq != nullptr && api.destroy_cq != nullptr && api.create_qp != nullptr &&
         api.destroy_qp != nullptr && api.modify_qp != nullptr && api.query_port != nullptr &&
         api.query_gid != nullptr && api.post_send != nullptr && api.poll_cq != nullptr;
}

uint64_t NowNs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000u + static_cast<uint64_t>(ts.tv_nsec);
}

bool GidIsZero(const ibv_gid& gid) {
  for (uint8_t b : gid.raw)
    if (b != 0) return false;
  return true;
}

class VerbsDomain final : public Domain {
 public:
  // The staging buffer every DMA goes through, registered LOCAL_WRITE on the
  // domain's PD: a transfer is split into chunks of at most this size.
  static constexpr size_t kStagingBytes = size_t{1} << 20;
  static constexpr uint8_t kPort = 1;

  VerbsDomain(const VerbsApi& api, ibv_pd* pd, int access, ibv_context* owned_ctx, bool owns_pd)
      : api_(api), pd_(pd), access_(access), owned_ctx_(owned_ctx), owns_pd_(owns_pd) {}
  ~VerbsDomain() override {
    if (forked_) return;  // the parent's objects: not ours to free
    DestroyQp();
    if (staging_mr_ != nullptr) api_.dereg_mr(staging_mr_);
    if (staging_ != nullptr) munmap(staging_, kStagingBytes);
    if (owns_pd_) api_.dealloc_pd(pd_);
    if (owned_ctx_ != nullptr) api_.close_device(owned_ctx_);
  }

  int Register(void* base, size_t len, Registration* out) override {
    // A fork child shares the parent's verbs context; registering through it
    // would act on the parent's objects.
    if (forked_) return EOPNOTSUPP;
    errno = 0;
    ibv_mr* mr = api_.RegMr(pd_, base, len, out->access != 0 ? out->access : access_);
    if (mr == nullptr) return errno != 0 ? errno : EIO;
    out->lkey = mr->lkey;
    out->rkey = mr->rkey;
    out->handle = mr;
    out->slots = 1;
    out->key_shift = 0;
    return 0;
  }

  int Deregister(void*, size_t, const Registration& reg) override {
    if (forked_) return 0;
    return api_.dereg_mr(static_cast<ibv_mr*>(reg.handle));
  }

  // RDMA WRITE from the staging buffer into the region (rkey of `reg`), as a
  // remote peer would: the bytes land in the pages the MR pinned.
  int DmaWrite(const Registration& reg, const void*, void* addr, const void* src,
               size_t n) override {
    return Transfer(reg, reinterpret_cast<uintptr_t>(addr), const_cast<void*>(src), n,
                    /*write=*/true);
  }
  // RDMA READ from the region's pinned pages into the staging buffer.
  int DmaRead(const Registration& reg, const void*, const void* addr, void* dst,
              size_t n) override {
    return Transfer(reg, reinterpret_cast<uintptr_t>(addr), dst, n, /*write=*/false);
  }

  // The child shares the parent's context, QP, CQ and MRs: drop the pointers,
  // touch nothing (the staging buffer is MADV_DONTFORK: not even mapped here).
  void ForgetAfterFork() override {
    forked_ = true;
    qp_ = nullptr;
    cq_ = nullptr;
    staging_mr_ = nullptr;
    staging_ = nullptr;
  }
  void* handle() const override { return pd_; }

 private:
  // Serialised by mu_ (API context only: the heap never calls Dma from a hook).
  int Transfer(const Registration& reg, uintptr_t remote, void* local, size_t n, bool write) {
    if (!HasDataPath(api_)) return ENOTSUP;
    if (forked_) return EOPNOTSUPP;
    LockGuard<Mutex<LockRank::kDataPath>> lock(mu_);
    int err = EnsureDataPath();
    if (err != 0) return err;
    auto* cpu = static_cast<uint8_t*>(local);
    for (size_t done = 0; done < n;) {
      size_t chunk = n - done < chunk_bytes_ ? n - done : chunk_bytes_;
      if (write) memcpy(staging_, cpu + done, chunk);
      err = PostAndWait(write ? IBV_WR_RDMA_WRITE : IBV_WR_RDMA_READ, remote + done, reg.rkey,
                        chunk);
      if (err != 0) return err;
      if (!write) memcpy(cpu + done, staging_, chunk);
      done += chunk;
    }
    return 0;
  }

  // One signaled work request, then a bounded wait for its completion. Any
  // failure leaves the QP in the error state (or with a request in flight):
  // it and its CQ are destroyed, and the next transfer makes new ones.
  int PostAndWait(ibv_wr_opcode op, uint64_t remote, uint32_t rkey, size_t len) {
    ibv_sge sge = {};
    sge.addr = reinterpret_cast<uintptr_t>(staging_);
    sge.length = static_cast<uint32_t>(len);
    sge.lkey = staging_mr_->lkey;
    ibv_send_wr wr = {};
    wr.wr_id = ++wr_id_;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.opcode = op;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.wr.rdma.remote_addr = remote;
    wr.wr.rdma.rkey = rkey;
    ibv_send_wr* bad = nullptr;
    int rc = api_.post_send(qp_, &wr, &bad);
    if (rc != 0) {
      DestroyQp();
      return rc > 0 ? rc : EIO;
    }
    const uint64_t deadline = NowNs() + static_cast<uint64_t>(api_.dma_timeout_ms) * 1000000u;
    ibv_wc wc;
    for (unsigned spins = 0;; spins++) {
      memset(&wc, 0, sizeof wc);
      int got = api_.poll_cq(cq_, 1, &wc);
      if (got < 0) {
        DestroyQp();
        return EIO;
      }
      if (got > 0) break;
      if (NowNs() >= deadline) {
        DestroyQp();  // also cancels the request still in flight
        return ETIMEDOUT;
      }
      // Spin briefly (small transfers complete in microseconds), then yield
      // the CPU: a soft NIC (rxe) runs on the same CPUs.
      if (spins >= 256) {
        timespec nap = {0, 20000};
        nanosleep(&nap, nullptr);
      }
    }
    if (wc.status == IBV_WC_SUCCESS && wc.wr_id == wr.wr_id) return 0;
    DestroyQp();
    if (wc.status == IBV_WC_REM_ACCESS_ERR) return EACCES;  // the MR lacks remote access
    return EIO;
  }

  // Creates what the data path needs on first use: never in the constructor
  // nor from Register/Deregister, which may run where allocating is unsafe.
  int EnsureDataPath() {
    if (staging_mr_ == nullptr) {
      int err = MakeStaging();
      if (err != 0) return err;
    }
    if (qp_ == nullptr) return MakeQp();
    return 0;
  }

  int MakeStaging() {
    void* p = mmap(nullptr, kStagingBytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                   -1, 0);
    if (p == MAP_FAILED) return errno != 0 ? errno : ENOMEM;
    // A fork child must not share (or copy) the pinned staging pages.
    madvise(p, kStagingBytes, MADV_DONTFORK);
    errno = 0;
    ibv_mr* mr = api_.RegMr(pd_, p, kStagingBytes, IBV_ACCESS_LOCAL_WRITE);
    if (mr == nullptr) {
      int err = errno != 0 ? errno : EIO;
      munmap(p, kStagingBytes);
      return err;
    }
    staging_ = p;
    staging_mr_ = mr;
    return 0;
  }

  // An RC QP on port 1 connected to itself: RESET -> INIT -> RTR -> RTS.
  int MakeQp() {
    ibv_context* ctx = pd_->context;
    ibv_port_attr port;
    memset(&port, 0, sizeof port);
    int rc = api_.query_port(ctx, kPort, &port);
    if (rc != 0) return rc > 0 ? rc : EIO;
    if (port.state != IBV_PORT_ACTIVE) return ENETDOWN;
    // RoCE (and IB with a GRH) addresses by GID: index 0, or the first valid one.
    ibv_gid gid;
    memset(&gid, 0, sizeof gid);
    int gid_index = -1;
    int gids = port.gid_tbl_len > 0 ? port.gid_tbl_len : 1;
    for (int i = 0; i < gids && i < 256 && gid_index < 0; i++) {
      if (api_.query_gid(ctx, kPort, i, &gid) == 0 && !GidIsZero(gid)) gid_index = i;
    }
    bool global = port.link_layer == IBV_LINK_LAYER_ETHERNET || port.lid == 0;
    if (global && gid_index < 0) return EADDRNOTAVAIL;
    chunk_bytes_ = kStagingBytes;
    if (port.max_msg_sz != 0 && port.max_msg_sz < chunk_bytes_) chunk_bytes_ = port.max_msg_sz;

    errno = 0;
    cq_ = api_.create_cq(ctx, 4, nullptr, nullptr, 0);
    if (cq_ == nullptr) return errno != 0 ? errno : EIO;
    ibv_qp_init_attr init;
    memset(&init, 0, sizeof init);
    init.send_cq = cq_;
    init.recv_cq = cq_;
    init.qp_type = IBV_QPT_RC;
    init.sq_sig_all = 0;
    init.cap.max_send_wr = 4;
    init.cap.max_recv_wr = 1;
    init.cap.max_send_sge = 1;
    init.cap.max_recv_sge = 1;
    errno = 0;
    qp_ = api_.create_qp(pd_, &init);
    if (qp_ == nullptr) {
      int err = errno != 0 ? errno : EIO;
      DestroyQp();
      return err;
    }

    const int remote_access =
        IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE;
    ibv_qp_attr a;
    memset(&a, 0, sizeof a);
    a.qp_state = IBV_QPS_INIT;
    a.pkey_index = 0;
    a.port_num = kPort;
    a.qp_access_flags = remote_access;  // the MR's own flags decide per region
    rc = api_.modify_qp(qp_, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
                                     IBV_QP_ACCESS_FLAGS);
    if (rc == 0) {
      memset(&a, 0, sizeof a);
      a.qp_state = IBV_QPS_RTR;
      a.path_mtu = port.active_mtu;
      a.dest_qp_num = qp_->qp_num;  // itself
      a.rq_psn = 0;
      a.max_dest_rd_atomic = 1;
      a.min_rnr_timer = 12;
      a.ah_attr.port_num = kPort;
      a.ah_attr.dlid = port.lid;
      if (global) {
        a.ah_attr.is_global = 1;  // RoCE needs a GRH
        a.ah_attr.grh.dgid = gid;
        a.ah_attr.grh.sgid_index = static_cast<uint8_t>(gid_index);
        a.ah_attr.grh.hop_limit = 1;
      }
      rc = api_.modify_qp(qp_, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
                                       IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC |
                                       IBV_QP_MIN_RNR_TIMER);
    }
    if (rc == 0) {
      memset(&a, 0, sizeof a);
      a.qp_state = IBV_QPS_RTS;
      a.timeout = 17;  // 4.096 us << 17 = 0.5 s: soft NICs under emulation are slow
      a.retry_cnt = 7;
      a.rnr_retry = 7;
      a.sq_psn = 0;
      a.max_rd_atomic = 1;
      rc = api_.modify_qp(qp_, &a, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
                                       IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
                                       IBV_QP_MAX_QP_RD_ATOMIC);
    }
    if (rc != 0) {
      DestroyQp();
      return rc > 0 ? rc : EIO;
    }
    return 0;
  }

  void DestroyQp() {
    if (qp_ != nullptr) api_.destroy_qp(qp_);
    if (cq_ != nullptr) api_.destroy_cq(cq_);
    qp_ = nullptr;
    cq_ = nullptr;
  }

  const VerbsApi api_;
  ibv_pd* const pd_;
  const int access_;
  ibv_context* const owned_ctx_;
  const bool owns_pd_;
  bool forked_ = false;

  // The data path, made on first use and guarded by mu_, which is held across
  // ibv_reg_mr and ibv_create_qp (they malloc): ranked below jemalloc.
  Mutex<LockRank::kDataPath> mu_;
  ibv_cq* cq_ = nullptr;
  ibv_qp* qp_ = nullptr;
  void* staging_ = nullptr;
  ibv_mr* staging_mr_ = nullptr;
  size_t chunk_bytes_ = kStagingBytes;
  uint64_t wr_id_ = 0;
};

class VerbsRegistrar final : public Registrar {
 public:
  VerbsRegistrar(const VerbsApi& api, const char* device)
      : api_(api), device_(device != nullptr ? device : "") {}
  const char* name() const override { return "verbs"; }
  const char* device_name() const override { return opened_; }
  // ibv_reg_mr/ibv_dereg_mr allocate (the MR object, fork-tracking nodes).
  bool hook_safe() const override { return false; }

  Domain* OpenDomain(ibv_pd* pd, int access, int* err) override {
    *err = 0;
    if (pd != nullptr) return new VerbsDomain(api_, pd, access, nullptr, false);
    int n = 0;
    ibv_device** list = api_.get_device_list(&n);
    if (list == nullptr) {
      *err = errno != 0 ? errno : ENODEV;
      return nullptr;
    }
    ibv_device* chosen = nullptr;
    for (int i = 0; i < n && chosen == nullptr; i++) {
      if (device_.empty() || device_ == api_.get_device_name(list[i])) chosen = list[i];
    }
    if (chosen != nullptr) {
      snprintf(opened_, sizeof opened_, "%s", api_.get_device_name(chosen));
    }
    errno = 0;
    ibv_context* ctx = chosen != nullptr ? api_.open_device(chosen) : nullptr;
    int open_err = errno;
    api_.free_device_list(list);
    if (ctx == nullptr) {
      *err = chosen == nullptr ? ENODEV : (open_err != 0 ? open_err : EIO);
      return nullptr;
    }
    errno = 0;
    ibv_pd* own_pd = api_.alloc_pd(ctx);
    if (own_pd == nullptr) {
      *err = errno != 0 ? errno : EIO;
      api_.close_device(ctx);
      return nullptr;
    }
    return new VerbsDomain(api_, own_pd, access, ctx, true);
  }

 private:
  const VerbsApi api_;
  const std::string device_;
  char opened_[64] = {};
};

template <typename F>
bool Bind(void* lib, const char* name, F* fn) {
  *fn = reinterpret_cast<F>(dlsym(lib, name));
  return *fn != nullptr;
}

// The static inline verbs.h functions, reachable through a function pointer.
int PostSend(ibv_qp* qp, ibv_send_wr* wr, ibv_send_wr** bad_wr) {
  return ibv_post_send(qp, wr, bad_wr);
}
int PollCq(ibv_cq* cq, int num_entries, ibv_wc* wc) { return ibv_poll_cq(cq, num_entries, wc); }

}  // namespace

int LoadVerbsApi(const char* library, VerbsApi* api) {
  if (library == nullptr || library[0] == '\0') library = "libibverbs.so.1";
  void* lib = dlopen(library, RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) return ENOENT;
  bool ok = Bind(lib, "ibv_get_device_list", &api->get_device_list) &&
            Bind(lib, "ibv_free_device_list", &api->free_device_list) &&
            Bind(lib, "ibv_get_device_name", &api->get_device_name) &&
            Bind(lib, "ibv_open_device", &api->open_device) &&
            Bind(lib, "ibv_close_device", &api->close_device) &&
            Bind(lib, "ibv_alloc_pd", &api->alloc_pd) &&
            Bind(lib, "ibv_dealloc_pd", &api->dealloc_pd) &&
            Bind(lib, "ibv_reg_mr", &api->reg_mr) &&
            Bind(lib, "ibv_dereg_mr", &api->dereg_mr);
  if (!ok) return ENOSYS;  // the library stays loaded: its functions are in use
  Bind(lib, "ibv_reg_mr_iova2", &api->reg_mr_iova2);  // IBVERBS_1.8, optional
  // The data path is optional (a stand-in library may have none of it); all
  // or nothing. dlsym picks each symbol's default version (IBVERBS_1.1).
  // "ibv_query_port" is the exported name behind verbs.h's inline wrapper.
  bool data = Bind(lib, "ibv_create_cq", &api->create_cq) &&
              Bind(lib, "ibv_destroy_cq", &api->destroy_cq) &&
              Bind(lib, "ibv_create_qp", &api->create_qp) &&
              Bind(lib, "ibv_destroy_qp", &api->destroy_qp) &&
              Bind(lib, "ibv_modify_qp", &api->modify_qp) &&
              Bind(lib, "ibv_query_port", &api->query_port) &&
              Bind(lib, "ibv_query_gid", &api->query_gid);
  if (data) {
    api->post_send = PostSend;
    api->poll_cq = PollCq;
  } else {
    api->create_cq = nullptr;
    api->destroy_cq = nullptr;
    api->create_qp = nullptr;
    api->destroy_qp = nullptr;
    api->modify_qp = nullptr;
    api->query_port = nullptr;
    api->query_gid = nullptr;
    api->post_send = nullptr;
    api->poll_cq = nullptr;
  }
  return 0;
}

int CountRdmaDevices() {
  int fd = open("/sys/class/infiniband", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return 0;
  alignas(8) char buf[4096];
  int count = 0;
  for (;;) {
    long n = syscall(SYS_getdents64, fd, buf, sizeof buf);
    if (n <= 0) break;
    for (long off = 0; off < n;) {
      auto* d = reinterpret_cast<struct dirent64*>(buf + off);
      if (d->d_name[0] != '.') count++;
      off += d->d_reclen;
    }
  }
  close(fd);
  return count;
}

std::unique_ptr<Registrar> MakeVerbsRegistrar(const VerbsApi& api, const char* device) {
  return std::make_unique<VerbsRegistrar>(api, device);
}

}  // namespace rdmalloc
