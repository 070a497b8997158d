// The kernel's futex, for the base layer's waits: a thread sleeps while a
// 32-bit word holds the value it expects, until another thread wakes it.
// Used by Mutex, the release thread, and threads that wait for rdmalloc's
// start. errno stays the caller's (a wait that finds the word changed fails
// with EAGAIN): free() must keep it, and jemalloc's hooks take Mutexes.
#ifndef RDMALLOC_ALLOCATOR_FUTEX_H_
#define RDMALLOC_ALLOCATOR_FUTEX_H_

#include <errno.h>
#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <climits>
#include <cstdint>

namespace rdmalloc {

template <typename T>
inline void Futex(std::atomic<T>* word, int op, T value) {
  static_assert(sizeof(std::atomic<T>) == sizeof(uint32_t) && std::atomic<T>::is_always_lock_free,
                "the kernel's futex word is the atomic itself");
  int caller_errno = errno;
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), op, static_cast<uint32_t>(value), nullptr,
          nullptr, 0);
  errno = caller_errno;
}

// Sleeps while *word == expected (or until a wake, or a signal): callers loop.
template <typename T>
inline void FutexWait(std::atomic<T>* word, T expected) {
  Futex(word, FUTEX_WAIT_PRIVATE, expected);
}

template <typename T>
inline void FutexWake(std::atomic<T>* word, int threads) {
  Futex(word, FUTEX_WAKE_PRIVATE, static_cast<T>(threads));
}

template <typename T>
inline void FutexWakeAll(std::atomic<T>* word) {
  FutexWake(word, INT_MAX);
}

}  // namespace rdmalloc

#endif  // RDMALLOC_ALLOCATOR_FUTEX_H_
