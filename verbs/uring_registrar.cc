#include "verbs/uring_registrar.h"

#include <errno.h>
#include <liburing.h>
#include <sys/mman.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <iterator>

#include "allocator/mutex.h"

namespace rdmalloc {
namespace {

// The "wire": a memfd the soft NIC reads from and writes to.
constexpr size_t kWireBytes = size_t{1} << 20;
constexpr unsigned kMaxSlotsPerRegion = 64;
constexpr int kRemoteWriteBit = 2, kRemoteReadBit = 4;  // RDMALLOC_ACCESS_REMOTE_*

class UringDomain final : public Domain {
 public:
  ~UringDomain() override { Close(); }

  int Open() {
    int rc = io_uring_queue_init(4, &ring_, 0);
    if (rc < 0) return -rc;
    rc = io_uring_register_buffers_sparse(&ring_, kUringSlots);
    if (rc < 0) {
      io_uring_queue_exit(&ring_);
      return -rc;
    }
    wire_ = memfd_create("rdmalloc-wire", MFD_CLOEXEC);
    if (wire_ < 0 || ftruncate(wire_, kWireBytes) != 0) {
      int err = errno;
      if (wire_ >= 0) close(wire_);
      wire_ = -1;
      io_uring_queue_exit(&ring_);
      return err;
    }
    std::fill(std::begin(used_), std::end(used_), 0);
    open_ = true;
    return 0;
  }

  int Register(void* base, size_t len, Registration* out) override {
    unsigned n = static_cast<unsigned>((len + kUringMaxBuffer - 1) / kUringMaxBuffer);
    if (n == 0 || n > kMaxSlotsPerRegion) return E2BIG;
    LockGuard g(lock_);
    if (int err = EnsureOpenLocked()) return err;
    int first = FindFreeSlotsLocked(n);
    if (first < 0) return ENOSPC;
    iovec iov[kMaxSlotsPerRegion];
    for (unsigned i = 0; i < n; i++) {
      size_t off = size_t{i} * kUringMaxBuffer;
      iov[i].iov_base = static_cast<char*>(base) + off;
      iov[i].iov_len = std::min(kUringMaxBuffer, len - off);
    }
    int rc = io_uring_register_buffers_update_tag(&ring_, first, iov, nullptr, n);
    if (rc < 0) return -rc;
    if (static_cast<unsigned>(rc) != n) {
      ClearSlotsLocked(first, rc);
      return EIO;
    }
    MarkSlots(first, n, true);
    out->lkey = out->rkey = static_cast<uint32_t>(first);
    out->slots = n;
    out->key_shift = kUringBufferShift;
    out->handle = nullptr;
    return 0;
  }

  int Deregister(void*, size_t, const Registration& reg) override {
    LockGuard g(lock_);
    if (!open_) return 0;  // forgotten after fork: the parent owns those slots
    int err = ClearSlotsLocked(reg.lkey, reg.slots);
    MarkSlots(reg.lkey, reg.slots, false);
    return err;
  }

  // A NIC refuses a peer's RDMA WRITE into an MR without remote write, and a
  // READ from one without remote read; so does this soft NIC (access 0: the
  // caller did not say, as in the registrar's own tests).
  int DmaWrite(const Registration& reg, const void* region_base, void* addr, const void* src,
               size_t n) override {
    if (reg.access != 0 && !(reg.access & kRemoteWriteBit)) return EACCES;
    return Transfer(reg, region_base, addr, const_cast<void*>(src), n, /*to_memory=*/true);
  }
  int DmaRead(const Registration& reg, const void* region_base, const void* addr, void* dst,
              size_t n) override {
    if (reg.access != 0 && !(reg.access & kRemoteReadBit)) return EACCES;
    return Transfer(reg, region_base, const_cast<void*>(addr), dst, n, /*to_memory=*/false);
  }

  void ForgetAfterFork() override {
    // The ring file and the wire are shared with the parent: drop our
    // references without unregistering anything, and reopen on next use.
    lock_.ResetAfterFork();
    if (!open_) return;
    io_uring_queue_exit(&ring_);
    close(wire_);
    wire_ = -1;
    open_ = false;
  }

  void* handle() const override { return const_cast<io_uring*>(&ring_); }

 private:
  static uint32_t SlotOffset(const void* region_base, const void* addr) {
    return static_cast<uint32_t>((static_cast<const char*>(addr) -
                                  static_cast<const char*>(region_base)) /
                                 kUringMaxBuffer);
  }

  void Close() {
    if (!open_) return;
    io_uring_queue_exit(&ring_);
    close(wire_);
    open_ = false;
  }

  int EnsureOpenLocked() { return open_ ? 0 : Open(); }

  int FindFreeSlotsLocked(unsigned n) const {
    unsigned run = 0;
    for (unsigned s = 0; s < kUringSlots; s++) {
      bool used = (used_[s / 64] >> (s % 64)) & 1;
      run = used ? 0 : run + 1;
      if (run == n) return static_cast<int>(s + 1 - n);
    }
    return -1;
  }

  void MarkSlots(unsigned first, unsigned n, bool used) {
    for (unsigned s = first; s < first + n; s++) {
      uint64_t bit = uint64_t{1} << (s % 64);
      used_[s / 64] = used ? (used_[s / 64] | bit) : (used_[s / 64] & ~bit);
    }
  }

  int ClearSlotsLocked(unsigned first, unsigned n) {
    iovec iov[kMaxSlotsPerRegion] = {};
    int rc = io_uring_register_buffers_update_tag(&ring_, first, iov, nullptr, n);
    return rc < 0 ? -rc : 0;
  }

  // One chunk at a time through the wire: never crosses a slot boundary.
  int Transfer(const Registration& reg, const void* region_base, void* addr, void* cpu, size_t n,
               bool to_memory) {
    LockGuard g(lock_);
    if (!open_) return ENODEV;
    char* mem = static_cast<char*>(addr);
    char* buf = static_cast<char*>(cpu);
    while (n > 0) {
      size_t in_slot = kUringMaxBuffer - static_cast<size_t>(mem - static_cast<const char*>(region_base)) % kUringMaxBuffer;
      size_t c = std::min({n, kWireBytes, in_slot});
      unsigned slot = reg.lkey + SlotOffset(region_base, mem);
      if (to_memory && pwrite(wire_, buf, c, 0) != static_cast<ssize_t>(c)) return errno ? errno : EIO;
      io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
      if (sqe == nullptr) return EBUSY;
      if (to_memory) {
        io_uring_prep_read_fixed(sqe, wire_, mem, static_cast<unsigned>(c), 0, static_cast<int>(slot));
      } else {
        io_uring_prep_write_fixed(sqe, wire_, mem, static_cast<unsigned>(c), 0, static_cast<int>(slot));
      }
      int rc = io_uring_submit_and_wait(&ring_, 1);
      if (rc < 0) return -rc;
      io_uring_cqe* cqe = nullptr;
      rc = io_uring_wait_cqe(&ring_, &cqe);
      if (rc < 0) return -rc;
      int res = cqe->res;
      io_uring_cqe_seen(&ring_, cqe);
      if (res < 0) return -res;
      if (static_cast<size_t>(res) != c) return EIO;
      if (!to_memory && pread(wire_, buf, c, 0) != static_cast<ssize_t>(c)) return errno ? errno : EIO;
      mem += c;
      buf += c;
      n -= c;
    }
    return 0;
  }

  io_uring ring_{};
  int wire_ = -1;
  bool open_ = false;
  // One lock for the slot table, (re)opening, the submission queue and the
  // wire: transfers are test/health-check traffic, registration is rare.
  Mutex<LockRank::kRing> lock_;
  uint64_t used_[kUringSlots / 64] = {};
};

class UringRegistrar final : public Registrar {
 public:
  const char* name() const override { return "uring"; }
  const char* device_name() const override { return ""; }
  bool hook_safe() const override { return true; }
  Domain* OpenDomain(ibv_pd*, int, int* err) override {
    auto* d = new UringDomain();
    *err = d->Open();
    if (*err != 0) {
      delete d;
      return nullptr;
    }
    return d;
  }
};

}  // namespace

int UringProbe() {
  io_uring ring;
  int rc = io_uring_queue_init(2, &ring, 0);
  if (rc < 0) return -rc;
  rc = io_uring_register_buffers_sparse(&ring, 1);
  io_uring_queue_exit(&ring);
  return rc < 0 ? -rc : 0;
}

std::unique_ptr<Registrar> MakeUringRegistrar() { return std::make_unique<UringRegistrar>(); }

}  // namespace rdmalloc
