// The release pipeline: regions whose release must leave the context that
// decided it (a hook, a lookup) wait in a queue for rdmalloc's release
// thread, which finishes them and tells the observers (rdmalloc_on_release).
// Callbacks run on that thread only, outside every lock; no rdmalloc call
// waits for it. How a region is finished (deregistered, unmapped) is the
// facade's: it hands the pipeline a function for that.
#ifndef RDMALLOC_ALLOCATOR_RELEASE_PIPELINE_H_
#define RDMALLOC_ALLOCATOR_RELEASE_PIPELINE_H_

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "allocator/rdmalloc.h"
#include "allocator/region.h"
#include "allocator/mutex.h"

namespace rdmalloc {

constexpr int kMaxObservers = 8;

class ReleasePipeline {
 public:
  constexpr ReleasePipeline() = default;
  ReleasePipeline(const ReleasePipeline&) = delete;
  ReleasePipeline& operator=(const ReleasePipeline&) = delete;

  // Finishes one queued region on the release thread: deregister, Notify,
  // unmap. Set once at start-up.
  using FinishFn = void (*)(Region* r, void* ctx);
  void set_finish(FinishFn finish, void* ctx) {
    finish_ = finish;
    finish_ctx_ = ctx;
  }

  // Any context, hook context included: never allocates, never waits but for
  // the queue's own lock.
  void Queue(Region* r);
  bool observed() const { return observer_count_.load() > 0; }

  // Starts the release thread if observers, queued work or `backend_needs_it`
  // (a backend that is not hook-safe) want one. API context only:
  // pthread_create allocates.
  void EnsureThread(bool backend_needs_it);

  // rdmalloc_on_release and _remove. Add waits for `frees_under_way` to say
  // false (hook code that read "no observers" and may purge; it never waits
  // for a callback).
  int AddObserver(rdmalloc_release_fn fn, void* arg, bool (*frees_under_way)(void* ctx),
                  void* ctx);
  int RemoveObserver(rdmalloc_release_fn fn, void* arg);
  // The release thread: tells every observer of [base, base+len).
  void Notify(uintptr_t base, size_t len);

  uint64_t pending() const {
    return static_cast<uint64_t>(pending_count_.load() + releasing_.load());
  }
  uint64_t deferred() const { return releases_deferred_.load(std::memory_order_relaxed); }
  uint64_t notified() const { return releases_notified_.load(std::memory_order_relaxed); }
  uint64_t observers() const { return static_cast<uint64_t>(observer_count_.load()); }

  // Fork: the observer table's lock is rank kObservers, the queue's
  // kReleaseQueue. The child has no release thread; its first malloc or
  // rdmalloc_* call starts one again, which takes over the queue.
  auto& observer_lock() { return observer_lock_; }
  auto& queue_lock() { return queue_lock_; }
  void ResetAfterFork();  // the queue's lock and the thread's state

 private:
  struct Observer {  // free while fn is nullptr; observer_lock_
    rdmalloc_release_fn fn = nullptr;
    void* arg = nullptr;
  };
  // A removed observer, owed its last call fn(NULL, 0, arg). Allocated by
  // RemoveObserver (API context), freed by the release thread after the call.
  struct Goodbye {
    rdmalloc_release_fn fn;
    void* arg;
    Goodbye* next;
  };

  void AddWork();
  void ReleaseQueued();
  void SayGoodbyes();
  static void* ThreadMain(void* pipeline);

  FinishFn finish_ = nullptr;
  void* finish_ctx_ = nullptr;
  Mutex<LockRank::kReleaseQueue> queue_lock_;
  Region* queue_ = nullptr;
  std::atomic<int> pending_count_{0};
  std::atomic<int> releasing_{0};  // taken off the queue, not yet finished
  std::atomic<int> work_{0};       // the thread's futex word: work was added
  std::atomic<bool> thread_{false};
  Mutex<LockRank::kObservers> observer_lock_;
  Observer observers_[kMaxObservers];
  Goodbye* goodbyes_ = nullptr;  // observer_lock_
  std::atomic<int> goodbyes_owed_{0};
  std::atomic<int> observer_count_{0};
  std::atomic<uint64_t> releases_deferred_{0}, releases_notified_{0};
};

}  // namespace rdmalloc

#endif  // RDMALLOC_ALLOCATOR_RELEASE_PIPELINE_H_
