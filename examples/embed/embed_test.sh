#!/bin/bash
# libminimpi.so embeds librdmalloc.a. Checks: it exports only its API,
# rdmalloc_* and the malloc family; an application linked against it alone
# gets rdmalloc as malloc; and whichever malloc wins (libminimpi's, a
# -ljemalloc linked before it, an LD_PRELOADed jemalloc or librdmalloc.so,
# glibc's when the library is dlopen'ed late) the program runs correctly and
# rdmalloc_lookup answers truthfully. See docs/EMBEDDING.md.
set -u
minimpi="$(cd "$(dirname "$1")" && pwd)/$(basename "$1")"
app="$2"
late_load="$3"
librdmalloc="$(cd "$(dirname "$4")" && pwd)/$(basename "$4")"
app_source="$5"
tmp="${TEST_TMPDIR:-$(mktemp -d)}"
unset GLIBC_TUNABLES LD_PRELOAD
# minimpi moves bytes with rdmalloc_dma_read/write, which act as a peer's RDMA
# READ/WRITE: the plain heap needs remote rights for them.
export RDMALLOC_ACCESS=local_write,remote_read,remote_write
# Enough static TLS for one dlopen'ed library with jemalloc inside (docs/EMBEDDING.md).
tunable=glibc.rtld.optional_static_tls=4096
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }

global_exports() {  # library: its exported (global, defined) dynamic symbols
  nm -D --defined-only "$1" | awk '$2 ~ /^[TWDBVRi]$/ {print $3}' | sort
}

# --- exports -------------------------------------------------------------
exports=$(global_exports "$minimpi")
for sym in minimpi_send minimpi_recv minimpi_alloc_mem minimpi_free_mem \
           malloc calloc realloc free posix_memalign aligned_alloc memalign valloc pvalloc \
           malloc_usable_size rdmalloc_lookup rdmalloc_dma_read rdmalloc_dma_write rdmalloc_stats \
           malloc_trim mallinfo mallinfo2 mallopt malloc_info malloc_stats; do
  grep -qx "$sym" <<<"$exports" || fail "libminimpi.so does not export $sym"
done
unexpected=$(grep -Ev '^(minimpi_[a-z_]+|rdmalloc_[a-z_]+|malloc|calloc|realloc|free|posix_memalign|aligned_alloc|memalign|valloc|pvalloc|malloc_usable_size|malloc_trim|mallinfo|mallinfo2|mallopt|malloc_info|malloc_stats|mallocx|rallocx|xallocx|sallocx|dallocx|sdallocx|nallocx|mallctl|mallctlnametomib|mallctlbymib|malloc_stats_print|malloc_message|malloc_conf|_Znw[a-zA-Z0-9_]+|_Zna[a-zA-Z0-9_]+|_Zdl[a-zA-Z0-9_]+|_Zda[a-zA-Z0-9_]+)$' <<<"$exports")
[ -z "$unexpected" ] || fail "libminimpi.so exports unexpected symbols: $(echo $unexpected)"
# The embedded API and the C++ operators are exactly librdmalloc.so's.
same_as_librdmalloc() {  # pattern what
  local ours theirs
  ours=$(grep -E "$1" <<<"$exports")
  theirs=$(global_exports "$librdmalloc" | grep -E "$1")
  [ -n "$theirs" ] && [ "$ours" == "$theirs" ] ||
    fail "$2 differ from librdmalloc.so's: $(diff <(echo "$ours") <(echo "$theirs") | tr '\n' ' ')"
}
same_as_librdmalloc '^rdmalloc_' "rdmalloc_* exports"
same_as_librdmalloc '^_Z(nw|na|dl|da)' "operator new/delete exports"
# Not even as local entries: nothing of the renamed jemalloc API is visible.
nm -D "$minimpi" | grep -q ' rdmj_' && fail "libminimpi.so's dynamic symbols mention rdmj_*"
echo "exports: $(wc -l <<<"$exports") symbols, $(grep -c '^_Z' <<<"$exports") of them operator new/delete"

# --- the application links against libminimpi.so alone -------------------
needed=$(readelf -d "$app" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p' | tr '\n' ' ')
echo "minimpi_app needs: $needed"
grep -qw 'libminimpi.so' <<<"$needed" || fail "minimpi_app does not need libminimpi.so"
grep -Eq 'rdmalloc|jemalloc' <<<"$needed" && fail "minimpi_app needs an allocator library besides libminimpi.so"

run_app() {  # name expected-malloc-provider expected-lookup expected-transfer command...
  local name="$1" provider="$2" lookup="$3" transfer="$4" out
  shift 4
  out=$("$@" 2>&1)
  local rc=$?
  echo "--- $name"
  echo "$out"
  [ $rc -eq 0 ] || fail "$name: exit $rc"
  grep -q "^malloc_from=$provider free_from=$provider new_from=$provider " <<<"$out" || fail "$name: malloc is not $provider's"
  grep -qx "malloc_lookup=$lookup" <<<"$out" || fail "$name: rdmalloc_lookup of malloc'd memory is not $lookup"
  grep -qx "malloc_transfer=$transfer" <<<"$out" || fail "$name: transfers from malloc'd memory are not $transfer"
  grep -qx "app: ok" <<<"$out" || fail "$name: the application's checks failed"
}
run_app "linked against libminimpi.so" libminimpi.so keys zero-copy "$app"
# With the default access the plain heap is registered for local use only:
# keys, but a peer's READ/WRITE is refused, so minimpi bounces.
run_app "default RDMALLOC_ACCESS" libminimpi.so keys bounced env -u RDMALLOC_ACCESS "$app"

# --- ... and with Debian's jemalloc in the same program --------------------
build_app() {  # output libraries...
  local out="$1"
  shift
  gcc -O1 -I. -o "$out" "$app_source" -L"$(dirname "$minimpi")" -Wl,--no-as-needed "$@" \
    -Wl,-rpath,"$(dirname "$minimpi")" -ldl || fail "cannot link $out ($*)"
  readelf -d "$out" | grep -q 'libjemalloc.so.2' || fail "$out does not load libjemalloc.so.2"
}
build_app "$tmp/app_minimpi_first" -lminimpi -ljemalloc
run_app "-lminimpi -ljemalloc" libminimpi.so keys zero-copy "$tmp/app_minimpi_first"
build_app "$tmp/app_jemalloc_first" -ljemalloc -lminimpi
run_app "-ljemalloc -lminimpi" libjemalloc.so.2 ENOTOURS bounced "$tmp/app_jemalloc_first"
jemalloc_so=$(ldd "$tmp/app_jemalloc_first" | awk '$1 == "libjemalloc.so.2" {print $3}')
run_app "LD_PRELOAD=libjemalloc.so.2" libjemalloc.so.2 ENOTOURS bounced env LD_PRELOAD="$jemalloc_so" "$app"
run_app "LD_PRELOAD=librdmalloc.so" librdmalloc.so keys zero-copy env LD_PRELOAD="$librdmalloc" "$app"

# --- dlopen'ed after glibc's malloc served the program --------------------
for mode in local global; do
  out=$("$late_load" "$minimpi" "$mode" 2>&1)
  rc=$?
  echo "--- late load ($mode), no tunable: $out"
  [ $rc -eq 2 ] || fail "late load ($mode) without $tunable: exit $rc, expected the dlopen failure"
  grep -qxF "dlopen failed: $minimpi: cannot allocate memory in static TLS block" <<<"$out" ||
    fail "late load ($mode) without $tunable: not the static TLS message"
  out=$(env GLIBC_TUNABLES="$tunable" "$late_load" "$minimpi" "$mode" 2>&1)
  rc=$?
  echo "--- late load ($mode), GLIBC_TUNABLES=$tunable:"
  echo "$out"
  [ $rc -eq 0 ] && grep -qx "late_load: ok" <<<"$out" || fail "late load ($mode) with $tunable: exit $rc"
done

# --- RDMALLOC_VERBOSE says when rdmalloc is not the process's malloc --------
note='another malloc serves the process'
RDMALLOC_VERBOSE=1 "$app" 2>&1 | grep -q "$note" && fail "verbose note although rdmalloc won"
RDMALLOC_VERBOSE=1 GLIBC_TUNABLES="$tunable" "$late_load" "$minimpi" local 2>&1 |
  grep -q "libminimpi.so: $note (.*libc.so.6)" || fail "no verbose note after a late load"
RDMALLOC_VERBOSE=1 LD_PRELOAD="$jemalloc_so" "$app" 2>&1 |
  grep -q "libminimpi.so: $note (.*libjemalloc.so.2)" || fail "no verbose note under a preloaded jemalloc"

if [ "$failures" -ne 0 ]; then
  echo "$failures check(s) failed"
  exit 1
fi
echo "embedding checks passed"
