#!/bin/bash
# Installs into a fresh prefix, then builds and runs C programs against the
# installed tree only: through pkg-config (shared) and with the archive.
set -euo pipefail
install_bin="$1"
tmp="${TEST_TMPDIR:-$(mktemp -d)}"
prefix="$tmp/prefix"
rm -rf "$prefix"
"$install_bin" --prefix="$prefix"

for f in lib/librdmalloc.so.0 lib/librdmalloc.a lib/librdmalloc_interpose.a include/rdmalloc.h bin/rdmalloc-run \
         libexec/rdmalloc/rdmalloc_options lib/pkgconfig/rdmalloc.pc; do
  [ -e "$prefix/$f" ] || { echo "FAIL: $f not installed"; exit 1; }
done
[ "$(readlink "$prefix/lib/librdmalloc.so")" == "librdmalloc.so.0" ] || { echo "FAIL: librdmalloc.so link"; exit 1; }

cat > "$tmp/prog.c" <<'C'
#include <rdmalloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
int main(void) {
  size_t n = 1 << 20;
  char *p = rdmalloc_alloc(n, RDMALLOC_REMOTE_READ); /* read back as a peer would */
  memset(p, 7, n);
  struct rdmalloc_keys k;
  int rc = rdmalloc_lookup(p, n, NULL, &k);
  char back[64];
  int drc = rc == RDMALLOC_OK ? rdmalloc_dma_read(&k, 0, back, sizeof back) : rc;
  struct rdmalloc_stats s;
  rdmalloc_stats(&s, sizeof s);
  printf("lookup=%d dma=%d byte=%d backend=%s registered=%llu\n", rc, drc, back[10],
         rdmalloc_backend(), (unsigned long long)s.bytes_registered);
  free(p);
  return rc == RDMALLOC_OK && drc == RDMALLOC_OK && back[10] == 7 ? 0 : 1;
}
C
export PKG_CONFIG_PATH="$prefix/lib/pkgconfig"
flags=$(pkg-config --cflags --libs rdmalloc)
echo "pkg-config: $flags"
gcc -o "$tmp/prog" "$tmp/prog.c" $flags -Wl,-rpath,"$prefix/lib"
out=$("$tmp/prog")
echo "shared: $out"
grep -q '^lookup=0 dma=0 byte=7 backend=uring' <<<"$out"

gcc -o "$tmp/prog_static" "$tmp/prog.c" $(pkg-config --cflags rdmalloc) \
  -Wl,--whole-archive "$prefix/lib/librdmalloc.a" -Wl,--no-whole-archive -lstdc++ -lm -lpthread -ldl
out=$("$tmp/prog_static")
echo "archive: $out"
grep -q '^lookup=0 dma=0 byte=7 backend=uring' <<<"$out"
if nm -D "$tmp/prog" | grep -q ' U malloc'; then
  readelf -d "$tmp/prog" | grep -q 'librdmalloc.so.0' || { echo "FAIL: prog does not need librdmalloc.so.0"; exit 1; }
fi

# The installed launcher on its own: without this test's runfiles tree to
# fall back on, it must find the installed library and settings helper.
installed_run() { env -u RUNFILES_DIR -u RUNFILES_MANIFEST_FILE "$prefix/bin/rdmalloc-run" "$@"; }
preload=$(installed_run -- printenv LD_PRELOAD 2>/dev/null)
[ "${preload%%:*}" == "$(cd "$prefix/lib" && pwd)/librdmalloc.so" ] ||
  { echo "FAIL: the installed launcher preloads '$preload', not the installed library"; exit 1; }
help=$(installed_run --help)
grep -q -- '--region-size=SIZE  (RDMALLOC_REGION_SIZE)' <<<"$help" ||
  { echo "FAIL: the installed launcher's --help does not list the settings: $help"; exit 1; }
report=$(installed_run --stats=json -- /bin/true 2>&1 >/dev/null)
python3 -c 'import json,sys; r=json.loads(sys.argv[1]); assert r["backend"]=="uring", r' "$report"
echo "install checks passed"
