// The program's own memory registrations: libibverbs' ibv_reg_mr,
// ibv_reg_mr_iova, ibv_reg_mr_iova2, ibv_rereg_mr and ibv_dereg_mr,
// interposed (docs/INTERPOSE.md); and ibv_dealloc_pd, since a pd the heap is
// registered on holds the heap's MRs, which would make it fail with EBUSY. verbs.h's ibv_reg_mr and ibv_reg_mr_iova
// are macros over inlines that call the exported ibv_reg_mr, ibv_reg_mr_iova
// or ibv_reg_mr_iova2: all three land here.
//
// Served: a range inside one heap region, on a pd the heap is registered on
// (a new pd is added), asking for rights the region's registration has, with
// iova == addr: the caller gets an MR object of rdmalloc's own (its addr,
// length, pd and context; the region's keys), and no kernel call is made.
// Forwarded: everything else, to the real libibverbs (found on its own
// handle, never through the global scope, so never back here).
//
// Either way, an MR on heap pages holds the regions under it: they are never
// purged or released while it exists (Heap::HoldRange).
//
// A separate object in the static archive (//allocator:verbs_interpose): a
// program or MPI library that embeds rdmalloc chooses whether to link it.
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <infiniband/verbs.h>
#include <sys/mman.h>

#include <atomic>
#include <cstdint>
#include <cstring>

#include "allocator/fork.h"
#include "allocator/heap.h"
#include "allocator/init.h"
#include "allocator/log.h"
#include "allocator/mutex.h"

#undef ibv_reg_mr
#undef ibv_reg_mr_iova

namespace rdmalloc {
namespace {

// The rights a served MR can carry; any other bit (memory windows, zero-based,
// on-demand paging, huge pages) asks for a registration of its own.
constexpr unsigned kServableRights =
    IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
    IBV_ACCESS_REMOTE_ATOMIC;
static_assert(int{IBV_ACCESS_LOCAL_WRITE} == int{RDMALLOC_ACCESS_LOCAL_WRITE} &&
                  int{IBV_ACCESS_REMOTE_WRITE} == int{RDMALLOC_ACCESS_REMOTE_WRITE} &&
                  int{IBV_ACCESS_REMOTE_READ} == int{RDMALLOC_ACCESS_REMOTE_READ} &&
                  int{IBV_ACCESS_REMOTE_ATOMIC} == int{RDMALLOC_ACCESS_REMOTE_ATOMIC},
              "rdmalloc's rights are libibverbs' bits");

struct RealVerbs {
  ibv_mr* (*reg_mr)(ibv_pd*, void*, size_t, int) = nullptr;
  ibv_mr* (*reg_mr_iova)(ibv_pd*, void*, size_t, uint64_t, int) = nullptr;
  ibv_mr* (*reg_mr_iova2)(ibv_pd*, void*, size_t, uint64_t, unsigned) = nullptr;
  int (*dereg_mr)(ibv_mr*) = nullptr;
  int (*rereg_mr)(ibv_mr*, int, ibv_pd*, void*, size_t, int) = nullptr;
  int (*dealloc_pd)(ibv_pd*) = nullptr;
};

template <typename F>
void Bind(void* lib, const char* name, const char* version, F* fn) {
  void* p = dlvsym(lib, name, version);
  if (p == nullptr) p = dlsym(lib, name);  // an unversioned libibverbs (tests' stand-in)
  *fn = reinterpret_cast<F>(p);
}

// libibverbs' own functions, from its handle: dlsym on a handle searches that
// library and its dependencies, never the program's global scope.
const RealVerbs& Real() {
  static const RealVerbs real = [] {
    RealVerbs r;
    const char* name = TheHeap().config().verbs_library;
    if (name[0] == '\0') name = "libibverbs.so.1";
    void* lib = dlopen(name, RTLD_NOW | RTLD_NOLOAD);
    if (lib == nullptr) lib = dlopen(name, RTLD_NOW | RTLD_LOCAL);
    if (lib == nullptr) {
      Log(0, "ibv_reg_mr interposed, but %s cannot be loaded: %s", name, dlerror());
      return r;
    }
    Bind(lib, "ibv_reg_mr", "IBVERBS_1.1", &r.reg_mr);
    Bind(lib, "ibv_reg_mr_iova", "IBVERBS_1.7", &r.reg_mr_iova);
    Bind(lib, "ibv_reg_mr_iova2", "IBVERBS_1.8", &r.reg_mr_iova2);
    Bind(lib, "ibv_dereg_mr", "IBVERBS_1.1", &r.dereg_mr);
    Bind(lib, "ibv_rereg_mr", "IBVERBS_1.1", &r.rereg_mr);
    Bind(lib, "ibv_dealloc_pd", "IBVERBS_1.1", &r.dealloc_pd);
    return r;
  }();
  return real;
}

// One MR of the program's. A served one is handed out: it begins like
// rdma-core's struct verbs_mr (ibv_mr, type, access), which providers may
// read past the ibv_mr. A forwarded one on heap pages is kept aside, found
// by the real MR's address, only for its holds.
constexpr int kInlineHolds = 4;
struct MrRecord {
  ibv_mr mr;
  int mr_type;  // rdma-core's IBV_MR_TYPE_MR
  int access;
  std::atomic<int> state;
  // A served MR that ibv_rereg_mr had to move to a kernel registration of
  // its own: the caller keeps this object, libibverbs has `real`.
  ibv_mr* real;
  // A record in use has holds; a free one has free-list links: never both.
  struct Holds {
    size_t nheld;
    Region* inline_held[kInlineHolds];
    Region** held;  // inline_held, or an mmap'd array of held_bytes
    size_t held_bytes;
  };
  struct Links {
    MrRecord* next_free;
    // The first record of a batch on the shared free list: the batch's last
    // record, its size, and the next batch.
    MrRecord* batch_tail;
    MrRecord* next_batch;
    unsigned batch_size;
  };
  union {
    Holds holds;
    Links links;
  };
};
// 128 bytes: telling a served MR from another pointer (MrTable::Record) is
// then a mask, not a division.
static_assert(sizeof(MrRecord) == 128, "MrRecord is two cache lines");
enum : int { kRecordFree = 0, kRecordServed = 1, kRecordForwarded = 2 };

// Records come from mmap'd chunks that are never unmapped, so telling a
// served MR from any other pointer never reads through that pointer.
constexpr size_t kRecordsPerChunk = 4096;
constexpr size_t kMaxChunks = 256;

// Free records a thread holds, so that a register/deregister pair takes no
// lock: taken from the shared list a batch (kBatch, or what an exiting
// thread gave back) at a time, and given back to its tail kBatch at a time,
// both without walking the records. A thread's records go back when it exits.
constexpr unsigned kBatch = 32;
struct RecordList {
  MrRecord* head = nullptr;
  MrRecord* tail = nullptr;
  unsigned n = 0;
};
struct ThreadRecords {
  RecordList taken, given;
  bool registered = false;  // with the exit key
};
__thread ThreadRecords t_records __attribute__((tls_model("initial-exec")));

class MrTable {
 public:
  MrRecord* Take() {
    ThreadRecords& t = t_records;
    if (t.taken.n == 0 && !Refill(t)) return nullptr;
    MrRecord* rec = t.taken.head;
    t.taken.head = rec->links.next_free;
    t.taken.n--;
    return rec;
  }
  // Freed records are reused last (FIFO, past the thread's batch), so a
  // stale second ibv_dereg_mr finds its record free for as long as possible.
  void Give(MrRecord* rec) {
    rec->state.store(kRecordFree, std::memory_order_release);
    ThreadRecords& t = t_records;
    rec->links.next_free = nullptr;
    if (t.given.tail != nullptr) t.given.tail->links.next_free = rec;
    else t.given.head = rec;
    t.given.tail = rec;
    if (++t.given.n == kBatch) GiveBatch(&t.given);
  }
  // A thread's records, back to the shared list at its exit (a fork child
  // loses those of the threads it did not inherit).
  void GiveAll(ThreadRecords* t) {
    if (t->given.n != 0) GiveBatch(&t->given);
    if (t->taken.n != 0) GiveBatch(&t->taken);
  }
  // The record at mr, in whatever state, or nullptr if mr is not one of
  // ours. Lock-free: compares addresses only, never reads through mr.
  MrRecord* Record(const ibv_mr* mr) const {
    uintptr_t a = reinterpret_cast<uintptr_t>(mr);
    size_t n = chunks_.load(std::memory_order_acquire);
    for (size_t i = 0; i < n; i++) {
      uintptr_t base = reinterpret_cast<uintptr_t>(chunk_[i].load(std::memory_order_acquire));
      if (a >= base && a < base + kRecordsPerChunk * sizeof(MrRecord)) {
        if ((a - base) % sizeof(MrRecord) != 0) return nullptr;
        return reinterpret_cast<MrRecord*>(a);
      }
    }
    return nullptr;
  }
  // Whether a served MR on pd is live. Lock-free, for ibv_dealloc_pd.
  bool ServedOn(const ibv_pd* pd) const {
    size_t n = chunks_.load(std::memory_order_acquire);
    for (size_t i = 0; i < n; i++) {
      const MrRecord* recs = chunk_[i].load(std::memory_order_acquire);
      for (size_t j = 0; j < kRecordsPerChunk; j++) {
        if (recs[j].state.load(std::memory_order_acquire) == kRecordServed && recs[j].mr.pd == pd)
          return true;
      }
    }
    return false;
  }
  // Forwarded MRs on heap pages, by the real MR's address.
  // False if there is no memory to remember it: the caller then keeps the
  // holds for good rather than let a purge pull pages from under the MR.
  bool Track(const ibv_mr* mr, MrRecord* rec) {
    LockGuard g(lock_);
    if ((tracked_ + 1) * 2 > capacity_ && !Rehash(capacity_ == 0 ? 1024 : capacity_ * 2))
      return false;
    Insert(mr, rec);
    tracked_++;
    return true;
  }
  MrRecord* Untrack(const ibv_mr* mr) {
    LockGuard g(lock_);
    if (capacity_ == 0) return nullptr;
    size_t i = Slot(mr);
    while (slots_[i].key != nullptr && slots_[i].key != mr) i = (i + 1) & (capacity_ - 1);
    if (slots_[i].key == nullptr) return nullptr;
    MrRecord* rec = slots_[i].rec;
    // Backward-shift deletion keeps every probe chain unbroken.
    for (size_t j = (i + 1) & (capacity_ - 1); slots_[j].key != nullptr; j = (j + 1) & (capacity_ - 1)) {
      size_t home = Slot(slots_[j].key);
      if (((j - home) & (capacity_ - 1)) >= ((j - i) & (capacity_ - 1))) {
        slots_[i] = slots_[j];
        i = j;
      }
    }
    slots_[i] = Entry();
    tracked_--;
    return rec;
  }
  auto& lock() { return lock_; }

 private:
  struct Entry {
    const ibv_mr* key = nullptr;
    MrRecord* rec = nullptr;
  };
  bool Refill(ThreadRecords& t);
  void GiveBatch(RecordList* list) {
    MrRecord* head = list->head;
    head->links.batch_tail = list->tail;
    head->links.batch_size = list->n;
    head->links.next_batch = nullptr;
    *list = RecordList();
    LockGuard g(lock_);
    AppendBatchLocked(head);
  }
  void AppendBatchLocked(MrRecord* head) {
    if (free_tail_ != nullptr) free_tail_->links.next_batch = head;
    else free_head_ = head;
    free_tail_ = head;
  }
  size_t Slot(const ibv_mr* mr) const {
    uint64_t h = reinterpret_cast<uintptr_t>(mr) * 0x9E3779B97F4A7C15ull;
    return static_cast<size_t>(h >> 20) & (capacity_ - 1);
  }
  void Insert(const ibv_mr* mr, MrRecord* rec) {
    size_t i = Slot(mr);
    while (slots_[i].key != nullptr) i = (i + 1) & (capacity_ - 1);
    slots_[i] = {mr, rec};
  }
  // With lock_ held; system calls only (no malloc: rank kMrTable).
  bool Rehash(size_t capacity) {
    void* mem = mmap(nullptr, capacity * sizeof(Entry), PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (mem == MAP_FAILED) return false;
    Entry* old = slots_;
    size_t old_capacity = capacity_;
    slots_ = static_cast<Entry*>(mem);
    capacity_ = capacity;
    for (size_t i = 0; i < old_capacity; i++)
      if (old[i].key != nullptr) Insert(old[i].key, old[i].rec);
    if (old != nullptr) munmap(old, old_capacity * sizeof(Entry));
    return true;
  }
  bool Grow() {
    size_t n = chunks_.load(std::memory_order_relaxed);
    if (n == kMaxChunks) return false;
    void* mem = mmap(nullptr, kRecordsPerChunk * sizeof(MrRecord), PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (mem == MAP_FAILED) return false;
    auto* recs = static_cast<MrRecord*>(mem);
    static_assert(kRecordsPerChunk % kBatch == 0, "a chunk is whole batches");
    for (size_t b = 0; b < kRecordsPerChunk; b += kBatch) {
      for (size_t i = b; i < b + kBatch; i++)
        recs[i].links.next_free = i + 1 < b + kBatch ? &recs[i + 1] : nullptr;
      recs[b].links.batch_tail = &recs[b + kBatch - 1];
      recs[b].links.batch_size = kBatch;
      AppendBatchLocked(&recs[b]);
    }
    chunk_[n].store(recs, std::memory_order_release);
    chunks_.store(n + 1, std::memory_order_release);
    return true;
  }

  Mutex<LockRank::kMrTable> lock_;
  MrRecord* free_head_ = nullptr;  // first and last batch
  MrRecord* free_tail_ = nullptr;
  std::atomic<MrRecord*> chunk_[kMaxChunks] = {};
  std::atomic<size_t> chunks_{0};
  Entry* slots_ = nullptr;
  size_t capacity_ = 0, tracked_ = 0;
};

MrTable g_table;

pthread_key_t g_records_key;
pthread_once_t g_records_key_once = PTHREAD_ONCE_INIT;

bool MrTable::Refill(ThreadRecords& t) {
  if (!t.registered) {
    // Its records go back when the thread exits (API context: may allocate).
    pthread_once(&g_records_key_once, [] {
      pthread_key_create(&g_records_key,
                         [](void* t) { g_table.GiveAll(static_cast<ThreadRecords*>(t)); });
    });
    t.registered = true;
    pthread_setspecific(g_records_key, &t);
  }
  LockGuard g(lock_);
  if (free_head_ == nullptr && !Grow()) return false;
  MrRecord* batch = free_head_;
  free_head_ = batch->links.next_batch;
  if (free_head_ == nullptr) free_tail_ = nullptr;
  t.taken.head = batch;
  t.taken.tail = batch->links.batch_tail;  // Take pops from the head: it stays the tail
  t.taken.n = batch->links.batch_size;
  return true;
}

std::atomic<bool> g_fork_handlers_installed{false};

__attribute__((noinline)) void InstallForkHandlersOnce() {
  if (g_fork_handlers_installed.exchange(true)) return;
  ForkHandlers fork;
  fork.prepare = [] { g_table.lock().Lock(); };
  fork.parent = [] { g_table.lock().Unlock(); };
  fork.child = [] { g_table.lock().ResetAfterFork(); };
  SetForkHandlers(LockRank::kMrTable, fork);
}


// Holds every region under [addr, addr+len) for rec. False if the holds could
// not be stored (then none is kept).
bool HoldPages(MrRecord* rec, const void* addr, size_t len) {
  rec->holds.nheld = 0;
  rec->holds.held = rec->holds.inline_held;
  rec->holds.held_bytes = 0;
  // Each region spans whole 2 MiB chunks: at most one per chunk touched.
  size_t most = len / kChunkSize + 2;
  if (most > kInlineHolds) {
    size_t bytes = most * sizeof(Region*);
    void* mem = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (mem == MAP_FAILED) return false;
    rec->holds.held = static_cast<Region**>(mem);
    rec->holds.held_bytes = bytes;
  }
  rec->holds.nheld = TheHeap().HoldRange(addr, len, rec->holds.held, most);
  return true;
}

// Every caller then gives the record back (its links overwrite the holds)
// or sets new holds (FillServed, HoldPages), so nothing is reset here.
inline void DropHolds(MrRecord* rec) {
  for (size_t i = 0; i < rec->holds.nheld; i++) TheHeap().DropHold(rec->holds.held[i]);
  if (rec->holds.held_bytes != 0) munmap(rec->holds.held, rec->holds.held_bytes);
}

bool Servable(unsigned access, uint64_t iova, const void* addr) {
  access &= ~static_cast<unsigned>(IBV_ACCESS_OPTIONAL_RANGE);
  if ((access & ~kServableRights) != 0) return false;
  // libibverbs refuses remote write or atomic without local write: so does
  // the forwarded call, with its own error.
  if ((access & (IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC)) &&
      !(access & IBV_ACCESS_LOCAL_WRITE))
    return false;
  return iova == reinterpret_cast<uintptr_t>(addr);
}

// rec, holding the served region alone, describes a served MR on
// [addr, addr+length).
void FillServed(MrRecord* rec, ibv_pd* pd, void* addr, size_t length, unsigned access,
                const Heap::Served& served) {
  rec->mr.context = pd->context;
  rec->mr.pd = pd;
  rec->mr.addr = addr;
  rec->mr.length = length;
  rec->mr.handle = served.region_mr != nullptr ? served.region_mr->handle : 0;
  rec->mr.lkey = served.lkey;
  rec->mr.rkey = served.rkey;
  rec->mr_type = 0;
  rec->access = static_cast<int>(access);
  rec->holds.nheld = 1;
  rec->holds.held = rec->holds.inline_held;
  rec->holds.held_bytes = 0;
  rec->holds.inline_held[0] = served.region;
}

// A served MR, or nullptr (then the caller forwards). Inline in the
// exported entry points, as is DeregServed: a served pair is two calls from
// the program and few more (each call and return is a costly indirect jump
// under emulation).
__attribute__((always_inline)) inline ibv_mr* Serve(ibv_pd* pd, void* addr, size_t length,
                                                    unsigned access, uint64_t iova) {
  if (!TheHeap().config().interpose || pd == nullptr || length == 0 ||
      !Servable(access, iova, addr))
    return nullptr;
  Heap::Served served;
  int servable_rights = static_cast<int>(access & kServableRights);
  if (TheHeap().ServeRegistration(pd, addr, length, servable_rights, &served) != RDMALLOC_OK)
    return nullptr;
  MrRecord* rec = g_table.Take();
  if (rec == nullptr) {
    TheHeap().DropHold(served.region);
    return nullptr;
  }
  rec->real = nullptr;
  FillServed(rec, pd, addr, length, access, served);
  rec->state.store(kRecordServed, std::memory_order_release);
  TheHeap().CountServed();
  return &rec->mr;
}

// After libibverbs made `mr` on [addr, addr+len): holds the heap regions
// under it, if any.
void TrackForwarded(ibv_mr* mr, const void* addr, size_t length) {
  if (mr == nullptr || length == 0) return;
  // Not heap memory at all (stack, static, mmap): nothing to hold or track.
  uintptr_t a = reinterpret_cast<uintptr_t>(addr);
  bool heap = false;
  for (uintptr_t c = a & ~(kChunkSize - 1); c - a < length || c < a; c += kChunkSize) {
    if (TheHeap().RegionOf(reinterpret_cast<const void*>(c < a ? a : c), 1) != nullptr) {
      heap = true;
      break;
    }
  }
  if (!heap) return;
  MrRecord* rec = g_table.Take();
  if (rec == nullptr || !HoldPages(rec, addr, length)) {
    Log(0, "no memory to record an MR on heap pages %p+%zu: its regions may be released under it",
        addr, length);
    if (rec != nullptr) g_table.Give(rec);
    return;
  }
  rec->real = mr;
  rec->state.store(kRecordForwarded, std::memory_order_release);
  if (!g_table.Track(mr, rec)) Log(0, "no memory to track an MR on heap pages: its regions stay held");
  TheHeap().forwarded_on_heap().fetch_add(1, std::memory_order_relaxed);
}

inline void Begin() {
  EnsureInitialised();
  if (!g_fork_handlers_installed.load(std::memory_order_acquire)) InstallForkHandlersOnce();
}

// libibverbs' ibv_reg_mr and ibv_reg_mr_iova only call ibv_reg_mr_iova2
// through its PLT, which resolves back here: call that one directly.
ibv_mr* Forward(ibv_pd* pd, void* addr, size_t length, uint64_t iova, unsigned access) {
  TheHeap().CountForwarded();
  const RealVerbs& real = Real();
  ibv_mr* mr = nullptr;
  if (real.reg_mr_iova2 != nullptr) {
    mr = real.reg_mr_iova2(pd, addr, length, iova, access);
  } else if (iova == reinterpret_cast<uintptr_t>(addr) && real.reg_mr != nullptr) {
    mr = real.reg_mr(pd, addr, length, static_cast<int>(access));  // a library before 1.8
  } else if (real.reg_mr_iova != nullptr) {
    mr = real.reg_mr_iova(pd, addr, length, iova, static_cast<int>(access));
  } else {
    errno = ENOSYS;
    return nullptr;
  }
  TrackForwarded(mr, addr, length);
  return mr;
}

__attribute__((always_inline)) inline int DeregServed(MrRecord* rec) {
  int expected = kRecordServed;
  // Two threads deregistering one MR: one wins, the other sees EINVAL.
  if (!rec->state.compare_exchange_strong(expected, kRecordFree)) return errno = EINVAL;
  if (rec->real != nullptr) {
    int rc = Real().dereg_mr(rec->real);
    if (rc != 0) {
      rec->state.store(kRecordServed);
      return rc;
    }
  }
  DropHolds(rec);
  TheHeap().CountServedGone();
  g_table.Give(rec);
  return 0;
}

int DeregForwarded(ibv_mr* mr) {
  if (Real().dereg_mr == nullptr) return errno = ENOSYS;
  MrRecord* tracked = g_table.Untrack(mr);
  int rc = Real().dereg_mr(mr);
  if (tracked == nullptr) return rc;
  if (rc != 0) {
    if (!g_table.Track(mr, tracked)) Log(0, "no memory to track an MR on heap pages: its regions stay held");
    return rc;  // the MR still exists, and so do its holds
  }
  DropHolds(tracked);
  TheHeap().forwarded_on_heap().fetch_sub(1, std::memory_order_relaxed);
  g_table.Give(tracked);
  return 0;
}

// libibverbs' checks of ibv_rereg_mr's arguments, before any work.
int CheckRereg(int flags, void* addr, size_t length, int access) {
  if ((flags & ~IBV_REREG_MR_FLAGS_SUPPORTED) != 0 ||
      ((flags & IBV_REREG_MR_CHANGE_TRANSLATION) && (length == 0 || addr == nullptr)) ||
      (access != 0 && !(flags & IBV_REREG_MR_CHANGE_ACCESS))) {
    errno = EINVAL;
    return IBV_REREG_MR_ERR_INPUT;
  }
  return 0;
}

// A served MR changes: served again from the heap if it can be, else moved
// to a kernel registration of its own behind the same object.
int ReregServed(MrRecord* rec, int flags, ibv_pd* pd, void* addr, size_t length, int access) {
  if (int rc = CheckRereg(flags, addr, length, access)) return rc;
  ibv_pd* new_pd = (flags & IBV_REREG_MR_CHANGE_PD) ? pd : rec->mr.pd;
  void* new_addr = (flags & IBV_REREG_MR_CHANGE_TRANSLATION) ? addr : rec->mr.addr;
  size_t new_length = (flags & IBV_REREG_MR_CHANGE_TRANSLATION) ? length : rec->mr.length;
  unsigned new_access = static_cast<unsigned>((flags & IBV_REREG_MR_CHANGE_ACCESS) ? access
                                                                                   : rec->access);
  if (rec->real != nullptr) {
    int rc = Real().rereg_mr(rec->real, flags, pd, addr, length, access);
    if (rc != 0) return rc;
  } else if (TheHeap().config().interpose && new_pd != nullptr &&
             Servable(new_access, reinterpret_cast<uintptr_t>(new_addr), new_addr)) {
    Heap::Served served;
    if (TheHeap().ServeRegistration(new_pd, new_addr, new_length,
                                    static_cast<int>(new_access & kServableRights),
                                    &served) == RDMALLOC_OK) {
      DropHolds(rec);
      FillServed(rec, new_pd, new_addr, new_length, new_access, served);
      return 0;
    }
  }
  if (rec->real == nullptr) {
    ibv_mr* real = nullptr;
    if (Real().reg_mr_iova2 != nullptr)
      real = Real().reg_mr_iova2(new_pd, new_addr, new_length,
                                 reinterpret_cast<uintptr_t>(new_addr), new_access);
    else if (Real().reg_mr != nullptr)
      real = Real().reg_mr(new_pd, new_addr, new_length, static_cast<int>(new_access));
    else
      errno = ENOSYS;
    if (real == nullptr) return IBV_REREG_MR_ERR_CMD;  // errno from libibverbs
    rec->real = real;
  }
  // The kernel registration's fields, and holds on its pages.
  DropHolds(rec);
  ibv_mr* real = rec->real;
  if (!HoldPages(rec, real->addr, real->length))
    Log(0, "no memory to record an MR on heap pages %p+%zu: its regions may be released under it",
        real->addr, real->length);
  rec->mr.context = real->context;
  rec->mr.pd = real->pd;
  rec->mr.addr = real->addr;
  rec->mr.length = real->length;
  rec->mr.handle = real->handle;
  rec->mr.lkey = real->lkey;
  rec->mr.rkey = real->rkey;
  rec->access = static_cast<int>(new_access);
  return 0;
}

int ReregForwarded(ibv_mr* mr, int flags, ibv_pd* pd, void* addr, size_t length, int access) {
  if (Real().rereg_mr == nullptr) {
    errno = ENOSYS;
    return IBV_REREG_MR_ERR_INPUT;
  }
  MrRecord* tracked = g_table.Untrack(mr);
  int rc = Real().rereg_mr(mr, flags, pd, addr, length, access);
  if (rc != 0) {
    // The MR (valid or not) must still be deregistered: its holds stay.
    if (tracked != nullptr && !g_table.Track(mr, tracked))
      Log(0, "no memory to track an MR on heap pages: its regions stay held");
    return rc;
  }
  if (tracked != nullptr) {
    DropHolds(tracked);
    TheHeap().forwarded_on_heap().fetch_sub(1, std::memory_order_relaxed);
    g_table.Give(tracked);
  }
  TrackForwarded(mr, mr->addr, mr->length);
  return 0;
}

}  // namespace
}  // namespace rdmalloc

extern "C" {

__attribute__((visibility("default"))) ibv_mr* ibv_reg_mr(ibv_pd* pd, void* addr, size_t length,
                                                          int access) {
  rdmalloc::Begin();
  if (ibv_mr* mr = rdmalloc::Serve(pd, addr, length, static_cast<unsigned>(access),
                                   reinterpret_cast<uintptr_t>(addr)))
    return mr;
  return rdmalloc::Forward(pd, addr, length, reinterpret_cast<uintptr_t>(addr),
                           static_cast<unsigned>(access));
}

__attribute__((visibility("default"))) ibv_mr* ibv_reg_mr_iova(ibv_pd* pd, void* addr,
                                                               size_t length, uint64_t iova,
                                                               int access) {
  rdmalloc::Begin();
  if (ibv_mr* mr = rdmalloc::Serve(pd, addr, length, static_cast<unsigned>(access), iova))
    return mr;
  return rdmalloc::Forward(pd, addr, length, iova, static_cast<unsigned>(access));
}

__attribute__((visibility("default"))) ibv_mr* ibv_reg_mr_iova2(ibv_pd* pd, void* addr,
                                                                size_t length, uint64_t iova,
                                                                unsigned access) {
  rdmalloc::Begin();
  if (ibv_mr* mr = rdmalloc::Serve(pd, addr, length, access, iova)) return mr;
  return rdmalloc::Forward(pd, addr, length, iova, access);
}

__attribute__((visibility("default"))) int ibv_dereg_mr(ibv_mr* mr) {
  rdmalloc::Begin();
  if (mr == nullptr) return errno = EINVAL;
  if (rdmalloc::MrRecord* rec = rdmalloc::g_table.Record(mr)) {
    // A record handed out is served; any other state means the MR is gone
    // already (a second dereg) or was never handed out.
    if (rec->state.load(std::memory_order_acquire) != rdmalloc::kRecordServed) return errno = EINVAL;
    return rdmalloc::DeregServed(rec);
  }
  return rdmalloc::DeregForwarded(mr);
}

__attribute__((visibility("default"))) int ibv_rereg_mr(ibv_mr* mr, int flags, ibv_pd* pd,
                                                        void* addr, size_t length, int access) {
  rdmalloc::Begin();
  if (mr == nullptr) {
    errno = EINVAL;
    return IBV_REREG_MR_ERR_INPUT;
  }
  if (rdmalloc::MrRecord* rec = rdmalloc::g_table.Record(mr)) {
    if (rec->state.load(std::memory_order_acquire) != rdmalloc::kRecordServed) {
      errno = EINVAL;
      return IBV_REREG_MR_ERR_INPUT;
    }
    return rdmalloc::ReregServed(rec, flags, pd, addr, length, access);
  }
  return rdmalloc::ReregForwarded(mr, flags, pd, addr, length, access);
}

// The heap's registrations on pd go first (it was added for the program's
// MRs); served MRs of the program still on it make it busy, as their kernel
// twins would.
__attribute__((visibility("default"))) int ibv_dealloc_pd(ibv_pd* pd) {
  rdmalloc::Begin();
  if (pd == nullptr) return errno = EINVAL;
  if (rdmalloc::g_table.ServedOn(pd)) return errno = EBUSY;
  rdmalloc::TheHeap().RemoveDomain(pd);  // RDMALLOC_EINVAL if it never was one: fine
  if (rdmalloc::Real().dealloc_pd == nullptr) return errno = ENOSYS;
  return rdmalloc::Real().dealloc_pd(pd);
}

}  // extern "C"
