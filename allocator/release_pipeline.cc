#include "allocator/release_pipeline.h"

#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>

#include <cstdlib>

#include "allocator/futex.h"
#include "allocator/log.h"

namespace rdmalloc {

void ReleasePipeline::Queue(Region* r) {
  {
    LockGuard g(queue_lock_);
    r->next = queue_;
    queue_ = r;
    pending_count_.fetch_add(1, std::memory_order_release);
  }
  releases_deferred_.fetch_add(1, std::memory_order_relaxed);
  AddWork();
}

void ReleasePipeline::AddWork() {
  work_.fetch_add(1, std::memory_order_release);
  if (thread_.load(std::memory_order_relaxed)) FutexWake(&work_, 1);
}

void ReleasePipeline::EnsureThread(bool backend_needs_it) {
  if (thread_.load(std::memory_order_acquire)) return;
  bool needed = backend_needs_it || observer_count_.load() > 0 || goodbyes_owed_.load() > 0 ||
                pending_count_.load() > 0;
  if (!needed || thread_.exchange(true)) return;
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
  // Signals are the application's business: none is delivered to this thread.
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old);
  pthread_t thread;
  int err = pthread_create(&thread, &attr, ThreadMain, this);
  pthread_sigmask(SIG_SETMASK, &old, nullptr);
  pthread_attr_destroy(&attr);
  if (err != 0) {
    thread_.store(false);
    Log(0, "cannot start the release thread (errno %d): released regions stay mapped and "
           "registered until it can be started",
        err);
    return;
  }
  pthread_setname_np(thread, "rdmalloc-rel");
}

void* ReleasePipeline::ThreadMain(void* arg) {
  auto* p = static_cast<ReleasePipeline*>(arg);
  for (;;) {
    if (p->work_.exchange(0, std::memory_order_acquire) == 0) FutexWait(&p->work_, 0);
    p->ReleaseQueued();
    p->SayGoodbyes();
  }
  return nullptr;
}

void ReleasePipeline::ReleaseQueued() {
  Region* list;
  {
    LockGuard g(queue_lock_);
    list = queue_;
    queue_ = nullptr;
    // Counted as releasing before it stops counting as queued: a reader
    // waiting for releases_pending == 0 never sees a gap.
    releasing_.fetch_add(pending_count_.load());
    pending_count_.store(0);
  }
  while (list != nullptr) {
    Region* r = list;
    list = r->next;
    finish_(r, finish_ctx_);
    releasing_.fetch_sub(1);
  }
}

// The observers are copied first, so that the table may change while they run.
void ReleasePipeline::Notify(uintptr_t base, size_t len) {
  Observer now[kMaxObservers];
  int n = 0;
  {
    LockGuard g(observer_lock_);
    for (const Observer& o : observers_) {
      if (o.fn != nullptr) now[n++] = o;
    }
  }
  for (int i = 0; i < n; i++) {
    now[i].fn(reinterpret_cast<void*>(base), len, now[i].arg);
    releases_notified_.fetch_add(1, std::memory_order_relaxed);
  }
}

// Removed observers' last calls, in the order of removal. The release thread
// makes every delivery, so each comes after any delivery to that observer
// that was under way when it was removed.
void ReleasePipeline::SayGoodbyes() {
  if (goodbyes_owed_.load() == 0) return;
  Goodbye* list;
  {
    LockGuard g(observer_lock_);
    list = goodbyes_;
    goodbyes_ = nullptr;
  }
  Goodbye* fifo = nullptr;
  while (list != nullptr) {
    Goodbye* next = list->next;
    list->next = fifo;
    fifo = list;
    list = next;
  }
  while (fifo != nullptr) {
    Goodbye* g = fifo;
    fifo = g->next;
    g->fn(nullptr, 0, g->arg);
    goodbyes_owed_.fetch_sub(1);
    free(g);
  }
}

int ReleasePipeline::AddObserver(rdmalloc_release_fn fn, void* arg,
                                 bool (*frees_under_way)(void* ctx), void* ctx) {
  if (fn == nullptr) return RDMALLOC_EINVAL;
  {
    LockGuard g(observer_lock_);
    Observer* slot = nullptr;
    for (Observer& o : observers_) {
      if (o.fn == fn && o.arg == arg) return RDMALLOC_EINVAL;  // already there
      if (o.fn == nullptr && slot == nullptr) slot = &o;
    }
    // Until its last call, a removed pair cannot come back: that call would
    // reach the new registration.
    for (Goodbye* b = goodbyes_; b != nullptr; b = b->next) {
      if (b->fn == fn && b->arg == arg) {
        errno = EBUSY;
        return RDMALLOC_EINVAL;
      }
    }
    if (slot == nullptr) {
      errno = ENOSPC;
      return RDMALLOC_EINVAL;
    }
    slot->fn = fn;
    slot->arg = arg;
    observer_count_.fetch_add(1);
  }
  // A free that read "no observers" may still purge or release without
  // telling; wait for those, so every release that ends after we return is
  // notified and nothing is purged.
  while (frees_under_way(ctx)) sched_yield();
  EnsureThread(false);
  return RDMALLOC_OK;
}

int ReleasePipeline::RemoveObserver(rdmalloc_release_fn fn, void* arg) {
  if (fn == nullptr) return RDMALLOC_EINVAL;
  auto* goodbye = static_cast<Goodbye*>(malloc(sizeof(Goodbye)));
  if (goodbye == nullptr) {
    errno = ENOMEM;
    return RDMALLOC_EINVAL;
  }
  {
    LockGuard g(observer_lock_);
    Observer* found = nullptr;
    for (Observer& o : observers_) {
      if (o.fn == fn && o.arg == arg) found = &o;
    }
    if (found != nullptr) {
      *found = Observer{};
      observer_count_.fetch_sub(1);
      *goodbye = Goodbye{fn, arg, goodbyes_};
      goodbyes_ = goodbye;
      goodbyes_owed_.fetch_add(1);
      goodbye = nullptr;
    }
  }
  if (goodbye != nullptr) {  // not registered
    free(goodbye);
    return RDMALLOC_EINVAL;
  }
  AddWork();
  EnsureThread(false);
  return RDMALLOC_OK;
}

// Threads do not survive fork. A release another thread had under way is not
// finished here (that region stays mapped in the child), and nobody may wait
// for work of threads that are gone.
void ReleasePipeline::ResetAfterFork() {
  queue_lock_.ResetAfterFork();
  thread_.store(false, std::memory_order_relaxed);
  releasing_.store(0, std::memory_order_relaxed);
  work_.store(pending_count_.load() + goodbyes_owed_.load(), std::memory_order_relaxed);
}

}  // namespace rdmalloc
