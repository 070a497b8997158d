// io_uring fixed buffers as a soft NIC: io_uring_register_buffers pins pages
// with the same kernel call as ibv_reg_mr, and READ_FIXED/WRITE_FIXED move
// bytes through the pinned pages, not through the process's current mapping.
#ifndef RDMALLOC_VERBS_URING_REGISTRAR_H_
#define RDMALLOC_VERBS_URING_REGISTRAR_H_

#include <memory>

#include "verbs/registrar.h"

namespace rdmalloc {

// Largest buffer one io_uring slot accepts; larger regions take several slots.
constexpr unsigned kUringBufferShift = 30;
constexpr size_t kUringMaxBuffer = size_t{1} << kUringBufferShift;
// Slots per ring (the kernel's IORING_MAX_REG_BUFFERS).
constexpr unsigned kUringSlots = 1u << 14;

// Returns 0 if this kernel lets us pin through io_uring, else an errno.
int UringProbe();

// The uring backend. Its domains never call malloc, so it is hook-safe.
std::unique_ptr<Registrar> MakeUringRegistrar();

}  // namespace rdmalloc

#endif  // RDMALLOC_VERBS_URING_REGISTRAR_H_
