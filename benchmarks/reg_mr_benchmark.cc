// What an unmodified verbs program pays to register a fresh buffer per
// message: malloc, ibv_reg_mr, ibv_dereg_mr, free, per size. Never includes
// rdmalloc.h and is not linked with rdmalloc: run.py runs it in the VM
// (real verbs on rxe0) without rdmalloc, and with librdmalloc.so preloaded
// so that its registrations are forwarded (default access) or served
// (RDMALLOC_ACCESS widened). Prints one line per size: the whole message
// (malloc, ibv_reg_mr, ibv_dereg_mr, free), the buffer alone (malloc, free),
// and their difference, what the registration costs:
//   size=N pairs=K ns_per_pair=T ns_buffer_only=B ns_reg_dereg=T-B
// With --threads=N, N threads do it at once on the same pd (as a progress
// thread and the application may): K counts one thread's pairs, and the
// times are wall time per pair of one thread.
//
//   reg_mr_benchmark [--min-time=SECONDS] [--access=local|remote] [--threads=N]
#include <infiniband/verbs.h>
#include <time.h>

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

// One message's registration: a fresh buffer, registered, deregistered,
// freed. With pd == nullptr only the buffer: what the registration adds is
// the difference.
bool Pair(ibv_pd* pd, size_t n, int access) {
  void* p = malloc(n);
  if (p == nullptr) return false;
  static_cast<volatile char*>(p)[0] = 1;  // a message is written before it is sent
  if (pd == nullptr) {
    free(p);
    return true;
  }
  ibv_mr* mr = ibv_reg_mr(pd, p, n, access);
  if (mr == nullptr) {
    free(p);
    return false;
  }
  bool ok = ibv_dereg_mr(mr) == 0;
  free(p);
  return ok;
}

// Pairs of `size` in batches of 16 until min_time has passed, on `threads`
// threads at once; each thread's count and wall time, ns per pair. False if
// a registration failed.
bool Measure(ibv_pd* pd, size_t size, int access, double min_time, int threads, long* pairs,
             double* ns) {
  std::atomic<bool> ok{true};
  std::vector<long> counts(threads);
  std::vector<double> times(threads);
  std::vector<std::thread> workers;
  for (int w = 0; w < threads; w++) {
    workers.emplace_back([&, w] {
      long n = 0;
      double t0 = Now(), t = t0;
      // Batches of 16 keep the clock off the measured loop's cost.
      while (t - t0 < min_time || n < 3) {
        for (int i = 0; i < 16; i++) {
          if (!Pair(pd, size, access)) ok = false;
        }
        n += 16;
        t = Now();
      }
      counts[w] = n;
      times[w] = (t - t0) * 1e9 / n;
    });
  }
  for (std::thread& t : workers) t.join();
  *pairs = counts[0];
  *ns = 0;
  for (double t : times) *ns += t / threads;
  return ok;
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
    else if (strcmp(argv[i], "--access=remote") != 0) usage = true;
  }
  if (usage || threads < 1) {
    fprintf(stderr, "usage: %s [--min-time=SECONDS] [--access=local|remote] [--threads=N]\n",
            argv[0]);
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
    for (int i = 0; i < 3; i++) {  // warm-up: first-touch, the region's registration
      if (!Pair(pd, size, access)) {
        fprintf(stderr, "reg_mr_benchmark: registration of %zu bytes failed\n", size);
        return 1;
      }
    }
    double ns[2];
    long pairs = 0;
    for (int with_reg = 1; with_reg >= 0; with_reg--) {
      if (!Measure(with_reg ? pd : nullptr, size, access, min_time, threads, &pairs, &ns[with_reg])) {
        fprintf(stderr, "reg_mr_benchmark: a registration of %zu bytes failed\n", size);
        return 1;
      }
    }
    printf("size=%zu pairs=%ld ns_per_pair=%.1f ns_buffer_only=%.1f ns_reg_dereg=%.1f\n", size,
           pairs, ns[1], ns[0], ns[1] - ns[0]);
    fflush(stdout);
  }
  ibv_dealloc_pd(pd);
  ibv_close_device(ctx);
  ibv_free_device_list(list);
  return 0;
}
