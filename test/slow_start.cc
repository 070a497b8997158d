// rdmalloc embedded in a library (as an MPI library embeds it) whose backend
// opens its domain slowly, SLOW_START_MS (test/fault_injection.h), for
// test/startup_wait_test: with RDMALLOC_REGISTER=eager the start opens it.
#include <cstdlib>

#include "test/fault_injection.h"

namespace {

__attribute__((constructor)) void InstallSlowStart() {
  rdmalloc_test::InstallFaultInjection();
  const char* ms = getenv("SLOW_START_MS");
  rdmalloc_test::DelayDomainOpens(ms != nullptr ? atoi(ms) : 0);
}

}  // namespace
