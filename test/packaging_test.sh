#!/bin/bash
# librdmalloc.so: SONAME, exactly the intended exports; librdmalloc.a: links
# into a shared library with --whole-archive, and that library serves malloc.
set -u
so="$(cd "$(dirname "$1")" && pwd)/$(basename "$1")"
archive="$(cd "$(dirname "$2")" && pwd)/$(basename "$2")"
header_dir="$(cd "$(dirname "$3")" && pwd)"
tmp="${TEST_TMPDIR:-$(mktemp -d)}"
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }

soname=$(readelf -d "$so" | sed -n 's/.*SONAME.*\[\(.*\)\]/\1/p')
[ "$soname" == "librdmalloc.so.0" ] || fail "SONAME is '$soname'"

check_exports() {  # library
  local exports unexpected
  exports=$(nm -D --defined-only "$1" | awk '$2 ~ /^[TWDBVR]$/ {print $3}' | sort)
  for sym in malloc calloc realloc free posix_memalign aligned_alloc memalign valloc pvalloc \
             malloc_usable_size mallctl rdmalloc_lookup rdmalloc_add_pd rdmalloc_remove_pd \
             rdmalloc_backend rdmalloc_dma_read rdmalloc_dma_write rdmalloc_stats _Znwm _ZdlPv; do
    grep -qx "$sym" <<<"$exports" || fail "$1 does not export $sym"
  done
  # Nothing else: no jemalloc internals (je_*), no rdmalloc C++ internals.
  unexpected=$(grep -Ev '^(malloc|calloc|realloc|free|posix_memalign|aligned_alloc|memalign|valloc|pvalloc|malloc_usable_size|mallocx|rallocx|xallocx|sallocx|dallocx|sdallocx|nallocx|mallctl|mallctlnametomib|mallctlbymib|malloc_stats_print|malloc_message|malloc_conf|rdmalloc_[a-z_]+|_Znw.*|_Zna.*|_Zdl.*|_Zda.*|minimpi_[a-z_]+)$' <<<"$exports")
  [ -z "$unexpected" ] || fail "$1 exports unexpected symbols: $(echo $unexpected)"
}
check_exports "$so"

# The archive inside another shared library, as an MPI library embeds it.
cat > "$tmp/embed.c" <<'C'
#include <stddef.h>
#include "rdmalloc.h"
int minimpi_keys_for(const void* p, size_t n, unsigned* lkey) {
  struct rdmalloc_keys k;
  int rc = rdmalloc_lookup(p, n, NULL, &k);
  *lkey = k.lkey;
  return rc;
}
C
cat > "$tmp/embed.map" <<'MAP'
{ global: malloc; calloc; realloc; free; posix_memalign; aligned_alloc; memalign; valloc; pvalloc;
  malloc_usable_size; mallocx; rallocx; xallocx; sallocx; dallocx; sdallocx; nallocx; mallctl;
  mallctlnametomib; mallctlbymib; malloc_stats_print; malloc_message; malloc_conf; rdmalloc_*;
  minimpi_*; _Znw*; _Zna*; _Zdl*; _Zda*; local: *; };
MAP
gcc -fPIC -shared -o "$tmp/libminimpi.so" -I"$header_dir" "$tmp/embed.c" \
  -Wl,--whole-archive "$archive" -Wl,--no-whole-archive \
  -Wl,--version-script="$tmp/embed.map" -lstdc++ -lpthread -ldl || fail "archive does not link into a shared library"
check_exports "$tmp/libminimpi.so"
cat > "$tmp/app.c" <<'C'
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
int minimpi_keys_for(const void* p, size_t n, unsigned* lkey);
int main(void) {
  char* p = malloc(100000);  /* plain malloc, served by the embedded rdmalloc */
  memset(p, 1, 100000);
  unsigned lkey = 0;
  int rc = minimpi_keys_for(p, 100000, &lkey);
  printf("lookup rc=%d lkey=%u\n", rc, lkey);
  free(p);
  return rc == 0 ? 0 : 1;
}
C
gcc -o "$tmp/app" "$tmp/app.c" -L"$tmp" -lminimpi -Wl,-rpath,"$tmp" || fail "app does not link"
"$tmp/app" || fail "app's malloc is not served by the embedded rdmalloc"

if [ "$failures" -ne 0 ]; then
  echo "$failures check(s) failed"
  exit 1
fi
echo "packaging checks passed"
