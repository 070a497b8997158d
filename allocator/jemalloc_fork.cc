// jemalloc's fork handlers, as rdmalloc's fork stage at jemalloc's rank
// (allocator/lock_order.h): jemalloc's call to pthread_atfork is renamed to
// rdmj_pthread_atfork when its archive is imported.
#include "allocator/fork.h"
#include "allocator/jemalloc_api.h"

namespace {

// jemalloc_prefork leaves out one of jemalloc's locks: the one taken to add
// a node to the global extent map, held across base_alloc and so across
// rdmalloc's hooks. It ranks between the arenas' extent locks and their base
// locks, inside jemalloc_prefork's arena stages, where no handler of ours
// can run; a child forked while another thread held it waited for it
// forever at its first allocation in a new GiB of address space. So the
// child re-initialises it, as jemalloc does its other mutexes. The holder was
// adding a node whose memory comes from base_alloc, whose own lock fork
// held: the child sees the map without that node and adds its own.
void (*g_jemalloc_child)() = nullptr;

void JemallocChild() {
  g_jemalloc_child();
  je_malloc_mutex_postfork_child(nullptr, &je_arena_emap_global.init_lock);
}

}  // namespace

extern "C" int rdmj_pthread_atfork(void (*prepare)(), void (*parent)(), void (*child)()) {
  rdmalloc::ForkHandlers jemalloc;
  jemalloc.prepare = prepare;
  jemalloc.parent = parent;
  g_jemalloc_child = child;
  jemalloc.child = JemallocChild;
  rdmalloc::SetForkHandlers(rdmalloc::LockRank::kJemalloc, jemalloc);
  return 0;
}
