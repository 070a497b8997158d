/* Prints jemalloc's build configuration and the options in force, through
 * the public mallctl, one "name=value" per line: linked against jemalloc's
 * freshly built library and against librdmalloc.so, it shows that the test
 * harness (compiled for the fresh build's configuration) matches the jemalloc
 * inside rdmalloc, and which options rdmalloc changes. */
#include <stdbool.h>
#include <stdio.h>
#include <sys/types.h>

int mallctl(const char *name, void *oldp, size_t *oldlenp, void *newp, size_t newlen);

enum kind { BOOL, STR, SIZE, SSIZE, UNSIGNED };

static const struct {
  const char *name;
  enum kind kind;
} kNames[] = {
    {"version", STR},
    {"config.cache_oblivious", BOOL},
    {"config.debug", BOOL},
    {"config.fill", BOOL},
    {"config.lazy_lock", BOOL},
    {"config.malloc_conf", STR},
    {"config.opt_safety_checks", BOOL},
    {"config.prof", BOOL},
    {"config.prof_libgcc", BOOL},
    {"config.prof_libunwind", BOOL},
    {"config.stats", BOOL},
    {"config.utrace", BOOL},
    {"config.xmalloc", BOOL},
    {"arenas.page", SIZE},
    {"arenas.quantum", SIZE},
    {"arenas.nbins", UNSIGNED},
    {"arenas.nlextents", UNSIGNED},
    {"opt.retain", BOOL},
    {"opt.oversize_threshold", SIZE},
    {"opt.dirty_decay_ms", SSIZE},
    {"opt.muzzy_decay_ms", SSIZE},
    {"opt.background_thread", BOOL},
    {"opt.tcache", BOOL},
    {"opt.metadata_thp", STR},
    {"opt.thp", STR},
};

int main(void) {
  for (size_t i = 0; i < sizeof(kNames) / sizeof(kNames[0]); i++) {
    const char *name = kNames[i].name;
    union {
      bool b;
      const char *s;
      size_t z;
      ssize_t sz;
      unsigned u;
    } v;
    static const size_t sizes[] = {sizeof(bool), sizeof(char *), sizeof(size_t), sizeof(ssize_t),
                                   sizeof(unsigned)};
    size_t n = sizes[kNames[i].kind];
    if (mallctl(name, &v, &n, NULL, 0) != 0) {
      printf("%s=(unavailable)\n", name);
      continue;
    }
    switch (kNames[i].kind) {
      case BOOL: printf("%s=%s\n", name, v.b ? "true" : "false"); break;
      case STR: printf("%s=%s\n", name, v.s ? v.s : "(null)"); break;
      case SIZE: printf("%s=%zu\n", name, v.z); break;
      case SSIZE: printf("%s=%zd\n", name, v.sz); break;
      case UNSIGNED: printf("%s=%u\n", name, v.u); break;
    }
  }
  return 0;
}
