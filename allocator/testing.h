// Test seams of the heap; never used by the allocator itself.
#ifndef RDMALLOC_ALLOCATOR_TESTING_H_
#define RDMALLOC_ALLOCATOR_TESTING_H_

#include "verbs/registrar.h"

namespace rdmalloc {
namespace testing {

// Fault injection: when the heap opens its backend it passes the registrar
// it made to `wrap` and uses what comes back (e.g. a decorator that fails
// registrations on demand). Set it before the first rdmalloc_* call; the
// backend starts lazily unless RDMALLOC_REGISTER=eager or RDMALLOC_VERBOSE>0.
using RegistrarWrapper = Registrar* (*)(Registrar* made);
void SetRegistrarWrapper(RegistrarWrapper wrap);

}  // namespace testing
}  // namespace rdmalloc

#endif  // RDMALLOC_ALLOCATOR_TESTING_H_
