// What an unmodified verbs program pays to register a fresh buffer per
// message: malloc, ibv_reg_mr, ibv_dereg_mr, free, per size. Never includes
// rdmalloc.h and is not linked with rdmalloc: run.py runs it in the VM
// (real verbs on rxe0) without rdmalloc, and with librdmalloc.so preloaded
// so that its registrations are forwarded (default access) or served
// (RDMALLOC_ACCESS widened). Prints one line per size: the whole message
// (malloc, write, ibv_reg_mr, ibv_dereg_mr, free), the registration alone
// (ibv_reg_mr + ibv_dereg_mr, timed around them, less the clock's own cost
// timed beside them),
// and the rest, the buffer:
//   size=N pairs=K ns_per_pair=T ns_buffer_only=T-R ns_reg_dereg=R
// Each is the median of kRounds rounds.
// With --threads=N, N threads do it at once on the same pd (as a progress
// thread and the application may): K counts one thread's pairs, and the
// times are wall time per pair of one thread.
//
//   reg_mr_benchmark [--min-time=SECONDS] [--access=local|remote] [--threads=N] [--window=N]
#include <infiniband/verbs.h>
#include <time.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

namespace {

double Now() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec / 1e9;
}

// Messages go in windows, as a sender keeps several in flight: each gets a
// fresh buffer (malloc, written), then the window's buffers are registered
// and deregistered, then freed. The clock brackets only the registrations,
// so what they cost is timed directly rather than as the difference of two
// long runs, which a page fault of a large buffer (under emulation,
// microseconds) swamps. A window holds up to kWindow messages and 4 MiB, so
// that large messages still go one at a time, as before windows.
// --window=N lowers the cap on messages (a control: with one at a time,
// every size pays what cold caches cost the first registration of a window).
constexpr int kWindow = 16;
constexpr size_t kWindowBytes = size_t{4} << 20;
int g_window = kWindow;
int WindowFor(size_t size) {
  size_t n = kWindowBytes / size;
  return n < 1 ? 1 : n > static_cast<size_t>(g_window) ? g_window : static_cast<int>(n);
}

struct Times {
  long pairs = 0;
  double message_ns = 0;  // per message, everything
  double reg_ns = 0;      // per message, ibv_reg_mr + ibv_dereg_mr
};

// One window; adds its times to *t. False if a registration failed.
bool Window(ibv_pd* pd, size_t n, int access, Times* t) {
  const int window = WindowFor(n);
  void* bufs[kWindow];
  ibv_mr* mrs[kWindow];
  bool ok = true;
  for (int i = 0; i < window; i++) {
    bufs[i] = malloc(n);
    if (bufs[i] == nullptr) abort();
    static_cast<volatile char*>(bufs[i])[0] = 1;  // a message is written before it is sent
  }
  // The clock's own cost, measured on the spot (an empty bracket), is taken
  // off: under emulation it is as large as a served registration.
  double ta = Now(), tb = Now();
  for (int i = 0; i < window; i++) mrs[i] = ibv_reg_mr(pd, bufs[i], n, access);
  for (int i = 0; i < window; i++) ok &= mrs[i] != nullptr && ibv_dereg_mr(mrs[i]) == 0;
  double tc = Now();
  t->reg_ns += ((tc - tb) - (tb - ta)) * 1e9;
  for (int i = 0; i < window; i++) free(bufs[i]);
  t->pairs += window;
  return ok;
}

// Windows of `size` until min_time has passed, on `threads` threads at once;
// per message, the mean over threads. False if a registration failed.
bool Measure(ibv_pd* pd, size_t size, int access, double min_time, int threads, Times* out) {
  std::atomic<bool> ok{true};
  std::vector<Times> times(threads);
  std::vector<std::thread> workers;
  for (int w = 0; w < threads; w++) {
    workers.emplace_back([&, w] {
      Times& t = times[w];
      double t0 = Now(), now = t0;
      while (now - t0 < min_time || t.pairs < 3 * kWindow) {
        if (!Window(pd, size, access, &t)) ok = false;
        now = Now();
      }
      t.message_ns = (now - t0) * 1e9;
    });
  }
  for (std::thread& t : workers) t.join();
  *out = Times();
  out->pairs = times[0].pairs;
  for (const Times& t : times) {
    out->message_ns += t.message_ns / t.pairs / threads;
    out->reg_ns += t.reg_ns / t.pairs / threads;
  }
  return ok;
}

constexpr int kRounds = 5;

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  double min_time = 0.5;
  int threads = 1;
  int access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE;
  bool usage = false;
  for (int i = 1; i < argc; i++) {
    if (strncmp(argv[i], "--min-time=", 11) == 0) min_time = atof(argv[i] + 11);
    else if (strcmp(argv[i], "--access=local") == 0) access = IBV_ACCESS_LOCAL_WRITE;
    else if (strncmp(argv[i], "--threads=", 10) == 0) threads = atoi(argv[i] + 10);
    else if (strncmp(argv[i], "--window=", 9) == 0) g_window = atoi(argv[i] + 9);
    else if (strcmp(argv[i], "--access=remote") != 0) usage = true;
  }
  if (usage || threads < 1 || g_window < 1 || g_window > kWindow) {
    fprintf(stderr,
            "usage: %s [--min-time=SECONDS] [--access=local|remote] [--threads=N] "
            "[--window=1..%d]\n",
            argv[0], kWindow);
    return 2;
  }
  int n = 0;
  ibv_device** list = ibv_get_device_list(&n);
  if (list == nullptr || n == 0) {
    fprintf(stderr, "reg_mr_benchmark: no RDMA device\n");
    return 1;
  }
  ibv_context* ctx = ibv_open_device(list[0]);
  ibv_pd* pd = ctx != nullptr ? ibv_alloc_pd(ctx) : nullptr;
  if (pd == nullptr) {
    fprintf(stderr, "reg_mr_benchmark: cannot open %s\n", ibv_get_device_name(list[0]));
    return 1;
  }
  const size_t sizes[] = {size_t{4} << 10, size_t{64} << 10, size_t{1} << 20, size_t{16} << 20};
  for (size_t size : sizes) {
    Times warm;
    for (int i = 0; i < 3; i++) {  // warm-up: first-touch, the region's registration
      if (!Window(pd, size, access, &warm)) {
        fprintf(stderr, "reg_mr_benchmark: registration of %zu bytes failed\n", size);
        return 1;
      }
    }
    // The median of kRounds: a stall of the machine hits one round, not the result.
    std::vector<double> message, reg;
    long pairs = 0;
    for (int round = 0; round < kRounds; round++) {
      Times t;
      if (!Measure(pd, size, access, min_time / kRounds, threads, &t)) {
        fprintf(stderr, "reg_mr_benchmark: a registration of %zu bytes failed\n", size);
        return 1;
      }
      message.push_back(t.message_ns);
      reg.push_back(t.reg_ns);
      pairs += t.pairs;
    }
    double m = Median(message), r = Median(reg);
    printf("size=%zu pairs=%ld ns_per_pair=%.1f ns_buffer_only=%.1f ns_reg_dereg=%.1f\n", size,
           pairs, m, m - r, r);
    fflush(stdout);
  }
  ibv_dealloc_pd(pd);
  ibv_close_device(ctx);
  ibv_free_device_list(list);
  return 0;
}
