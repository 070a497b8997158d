// The fork protocol: one pthread_atfork handler for the whole allocator,
// rdmalloc's parts and jemalloc alike. Before fork it takes every lock that
// takes part, in the one lock order (allocator/lock_order.h); after fork the
// parent releases them in reverse order and the child resets them, also in
// reverse order. jemalloc's own atfork registration is routed here
// (third_party/jemalloc_renames.txt renames its pthread_atfork), so that its
// handlers run at their rank, kJemalloc, and not wherever registration order
// would put them.
#ifndef RDMALLOC_ALLOCATOR_FORK_H_
#define RDMALLOC_ALLOCATOR_FORK_H_

#include "allocator/lock_order.h"

namespace rdmalloc {

struct ForkHandlers {
  void (*prepare)() = nullptr;  // take the rank's locks
  void (*parent)() = nullptr;   // release them
  void (*child)() = nullptr;    // reset them; repair what the other threads left
};

// Each part states its handlers once, at start-up, before the first fork.
void SetForkHandlers(LockRank rank, const ForkHandlers& handlers);

}  // namespace rdmalloc

// jemalloc's call to pthread_atfork, renamed: records its handlers as the
// kJemalloc rank and registers the protocol with the C library (once).
// Defined with jemalloc (allocator/jemalloc_fork.cc).
extern "C" int rdmj_pthread_atfork(void (*prepare)(), void (*parent)(), void (*child)());

#endif  // RDMALLOC_ALLOCATOR_FORK_H_
