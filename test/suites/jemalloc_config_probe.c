/* Prints jemalloc's build configuration and the options in force, through
 * the public mallctl, one "name=value" per line: linked against jemalloc's
 * freshly built library and against librdmalloc.so, it shows that the test
 * harness (compiled for the fresh build's configuration) matches the jemalloc
 * inside rdmalloc, and which options rdmalloc changes. */
#include <stdbool.h>
#include <stdio.h>
#include <sys/types.h>

int mallctl(const char *name, void *oldp, size_t *oldlenp, void *newp, size_t newlen);

static void print_bool(const char *name) {
  bool v;
  size_t n = sizeof(v);
  if (mallctl(name, &v, &n, NULL, 0) == 0) printf("%s=%s\n", name, v ? "true" : "false");
  else printf("%s=(unavailable)\n", name);
}

static void print_str(const char *name) {
  const char *v;
  size_t n = sizeof(v);
  if (mallctl(name, &v, &n, NULL, 0) == 0) printf("%s=%s\n", name, v ? v : "(null)");
  else printf("%s=(unavailable)\n", name);
}

static void print_size(const char *name) {
  size_t v;
  size_t n = sizeof(v);
  if (mallctl(name, &v, &n, NULL, 0) == 0) printf("%s=%zu\n", name, v);
  else printf("%s=(unavailable)\n", name);
}

static void print_ssize(const char *name) {
  ssize_t v;
  size_t n = sizeof(v);
  if (mallctl(name, &v, &n, NULL, 0) == 0) printf("%s=%zd\n", name, v);
  else printf("%s=(unavailable)\n", name);
}

static void print_unsigned(const char *name) {
  unsigned v;
  size_t n = sizeof(v);
  if (mallctl(name, &v, &n, NULL, 0) == 0) printf("%s=%u\n", name, v);
  else printf("%s=(unavailable)\n", name);
}

int main(void) {
  print_str("version");
  print_bool("config.cache_oblivious");
  print_bool("config.debug");
  print_bool("config.fill");
  print_bool("config.lazy_lock");
  print_str("config.malloc_conf");
  print_bool("config.opt_safety_checks");
  print_bool("config.prof");
  print_bool("config.prof_libgcc");
  print_bool("config.prof_libunwind");
  print_bool("config.stats");
  print_bool("config.utrace");
  print_bool("config.xmalloc");
  print_size("arenas.page");
  print_size("arenas.quantum");
  print_unsigned("arenas.nbins");
  print_unsigned("arenas.nlextents");
  print_bool("opt.retain");
  print_size("opt.oversize_threshold");
  print_ssize("opt.dirty_decay_ms");
  print_ssize("opt.muzzy_decay_ms");
  print_bool("opt.background_thread");
  print_bool("opt.tcache");
  print_str("opt.metadata_thp");
  print_str("opt.thp");
  return 0;
}
