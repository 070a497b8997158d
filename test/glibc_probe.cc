// Prints test/glibc_probes.h's probes, one "name<TAB>outcome" line each, with
// the process's malloc: glibc's, or rdmalloc's when librdmalloc.so is
// preloaded. No allocator is linked in (see //test:glibc_compat_test).
#include "test/glibc_probes.h"

int main() {
  for (const glibc_probes::Probe& p : glibc_probes::AllProbes()) {
    printf("%s\t%s\n", p.first.c_str(), p.second.c_str());
  }
  return 0;
}
