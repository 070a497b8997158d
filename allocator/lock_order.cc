#include "allocator/lock_order.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>

namespace rdmalloc {

const char* LockRankName(LockRank rank) {
  switch (rank) {
    case LockRank::kInit: return "initialisation";
    case LockRank::kClassArenas: return "class arenas";
    case LockRank::kControl: return "mallctl guard";
    case LockRank::kApi: return "api";
    case LockRank::kObservers: return "observers";
    case LockRank::kRegion: return "region registration";
    case LockRank::kDataPath: return "verbs data path";
    case LockRank::kJemalloc: return "jemalloc";
    case LockRank::kHeap: return "heap";
    case LockRank::kReleaseQueue: return "release queue";
    case LockRank::kRing: return "uring ring";
    case LockRank::kMrTable: return "interposed MR table";
    case LockRank::kCount: break;
  }
  return "?";
}

#ifdef RDMALLOC_WITNESS
namespace witness {
namespace {

constexpr int kRanks = static_cast<int>(LockRank::kCount);
// Locks of each rank this thread holds (jemalloc: hooks it is inside).
__thread uint8_t t_held[kRanks] __attribute__((tls_model("initial-exec")));

[[noreturn]] void Violation(LockRank taking, int held) {
  char line[256];
  int n = snprintf(line, sizeof line,
                   "rdmalloc: lock order violated: taking '%s' (rank %d) while holding '%s' "
                   "(rank %d); see docs/DESIGN.md \"Lock order\"\n",
                   LockRankName(taking), static_cast<int>(taking),
                   LockRankName(static_cast<LockRank>(held)), held);
  ssize_t ignored = write(STDERR_FILENO, line, n > 0 ? static_cast<size_t>(n) : 0);
  (void)ignored;
  abort();
}

}  // namespace

void Acquiring(LockRank rank) {
  for (int r = static_cast<int>(rank); r < kRanks; r++) {
    if (t_held[r] != 0) Violation(rank, r);
  }
}

void AcquiringInSeries(LockRank rank) {
  for (int r = static_cast<int>(rank) + 1; r < kRanks; r++) {
    if (t_held[r] != 0) Violation(rank, r);
  }
}

void Acquired(LockRank rank) { t_held[static_cast<int>(rank)]++; }

void Released(LockRank rank) { t_held[static_cast<int>(rank)]--; }

void EnterHook() { Acquired(LockRank::kJemalloc); }
void LeaveHook() { Released(LockRank::kJemalloc); }

void ForgetHeld() {
  for (uint8_t& held : t_held) held = 0;
}

}  // namespace witness
#endif

}  // namespace rdmalloc
