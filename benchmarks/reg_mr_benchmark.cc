// What an unmodified verbs program pays to register a fresh buffer per
// message: malloc, ibv_reg_mr, ibv_dereg_mr, free, per size. Never includes
// rdmalloc.h and is not linked with rdmalloc: run.py runs it in the VM
// (real verbs on rxe0) without rdmalloc, and with librdmalloc.so preloaded
// so that its registrations are forwarded (default access) or served
// (RDMALLOC_ACCESS widened). Prints one line per size: the whole message
// (malloc, ibv_reg_mr, ibv_dereg_mr, free), the buffer alone (malloc, free),
// and their difference, what the registration costs:
//   size=N pairs=K ns_per_pair=T ns_buffer_only=B ns_reg_dereg=T-B
//
//   reg_mr_benchmark [--min-time=SECONDS] [--access=local|remote]
#include <infiniband/verbs.h>
#include <time.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

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

}  // namespace

int main(int argc, char** argv) {
  double min_time = 0.5;
  int access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE;
  for (int i = 1; i < argc; i++) {
    if (strncmp(argv[i], "--min-time=", 11) == 0) min_time = atof(argv[i] + 11);
    else if (strcmp(argv[i], "--access=local") == 0) access = IBV_ACCESS_LOCAL_WRITE;
    else if (strcmp(argv[i], "--access=remote") != 0) {
      fprintf(stderr, "usage: %s [--min-time=SECONDS] [--access=local|remote]\n", argv[0]);
      return 2;
    }
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
      pairs = 0;
      double t0 = Now(), t = t0;
      // Batches of 16 keep the clock off the measured loop's cost.
      while (t - t0 < min_time || pairs < 3) {
        for (int i = 0; i < 16; i++) Pair(with_reg ? pd : nullptr, size, access);
        pairs += 16;
        t = Now();
      }
      ns[with_reg] = (t - t0) * 1e9 / pairs;
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
