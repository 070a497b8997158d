// The one seam between the heap and whatever pins memory for a NIC.
//
// A Registrar is a backend (ibverbs, io_uring pinning). It opens Domains: a
// domain is a protection domain (verbs) or a pinning ring (uring). The heap
// registers each region with each domain and keeps the Registration it gets.
#ifndef RDMALLOC_VERBS_REGISTRAR_H_
#define RDMALLOC_VERBS_REGISTRAR_H_

#include <cstddef>
#include <cstdint>

struct ibv_pd;
struct ibv_mr;

namespace rdmalloc {

// What one domain holds for one region.
struct Registration {
  // In: the rights to register with (RDMALLOC_ACCESS_* bits); 0 means the
  // domain's own (those it was opened with). Access classes need per-region
  // rights under one protection domain.
  int access = 0;
  uint32_t lkey = 0;
  uint32_t rkey = 0;
  void* handle = nullptr;  // ibv_mr* (verbs); nullptr (uring)
  uint32_t slots = 0;      // uring: consecutive buffer slots starting at lkey
  // 0: one key pair covers the region. Otherwise the keys for an address are
  // lkey/rkey + (addr - region base) >> key_shift (uring: one slot per GiB).
  uint32_t key_shift = 0;
};

class Domain {
 public:
  virtual ~Domain() = default;
  // Pins [base, base+len) for the NIC. Returns 0 or an errno.
  virtual int Register(void* base, size_t len, Registration* out) = 0;
  virtual int Deregister(void* base, size_t len, const Registration& reg) = 0;
  // Moves n bytes between CPU memory and the registered pages of `reg`
  // (region at region_base) at `addr`, through the registration. Returns 0 or errno.
  virtual int DmaWrite(const Registration& reg, const void* region_base, void* addr,
                       const void* src, size_t n) = 0;
  virtual int DmaRead(const Registration& reg, const void* region_base, const void* addr,
                      void* dst, size_t n) = 0;
  // In a fork child: drop every kernel object shared with the parent without
  // touching it (the parent still uses it). Must not allocate.
  virtual void ForgetAfterFork() = 0;
  virtual void* handle() const = 0;
};

class Registrar {
 public:
  virtual ~Registrar() = default;
  virtual const char* name() const = 0;
  // The device the default domain opened ("" before, or without devices).
  virtual const char* device_name() const = 0;
  // True when Domain::Register/Deregister never call malloc, so the heap may
  // call them inside jemalloc's (reentrant) extent hooks.
  virtual bool hook_safe() const = 0;
  // pd == nullptr opens the backend's default domain. Returns nullptr and sets
  // *err on failure. May allocate: never called from hook context.
  virtual Domain* OpenDomain(ibv_pd* pd, int access, int* err) = 0;
};

}  // namespace rdmalloc

#endif  // RDMALLOC_VERBS_REGISTRAR_H_
