#include "allocator/fork.h"

#include <pthread.h>

#include <atomic>

#include "allocator/startup_data.h"

namespace rdmalloc {
namespace {

constexpr int kRanks = static_cast<int>(LockRank::kCount);
RDMALLOC_STARTUP_DATA ForkHandlers g_handlers[kRanks];  // set at every start

void Prepare() {
  for (int r = 0; r < kRanks; r++) {
    bool jemalloc = r == static_cast<int>(LockRank::kJemalloc);
    if (jemalloc) witness::Acquiring(LockRank::kJemalloc);
    if (g_handlers[r].prepare != nullptr) g_handlers[r].prepare();
    // jemalloc's prefork holds all of jemalloc's mutexes from here on.
    if (jemalloc) witness::Acquired(LockRank::kJemalloc);
  }
}

void Parent() {
  for (int r = kRanks - 1; r >= 0; r--) {
    if (r == static_cast<int>(LockRank::kJemalloc)) witness::Released(LockRank::kJemalloc);
    if (g_handlers[r].parent != nullptr) g_handlers[r].parent();
  }
}

// Resetting a lock is not releasing it: the witness forgets what this
// thread held once every rank is reset.
void Child() {
  for (int r = kRanks - 1; r >= 0; r--) {
    if (g_handlers[r].child != nullptr) g_handlers[r].child();
  }
  witness::ForgetHeld();
}

void Register() {
  RDMALLOC_STARTUP_DATA static std::atomic<bool> registered{false};
  if (!registered.exchange(true)) pthread_atfork(Prepare, Parent, Child);
}

}  // namespace

void SetForkHandlers(LockRank rank, const ForkHandlers& handlers) {
  g_handlers[static_cast<int>(rank)] = handlers;
  Register();
}

}  // namespace rdmalloc
