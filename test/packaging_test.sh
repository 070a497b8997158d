#!/bin/bash
# librdmalloc.so: SONAME, exactly the intended exports, little initialised
# data, and start-up state on few pages. (librdmalloc.a inside another
# shared library: //examples/embed:embed_test.)
set -u
so="$1"
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }

soname=$(readelf -d "$so" | sed -n 's/.*SONAME.*\[\(.*\)\]/\1/p')
[ "$soname" == "librdmalloc.so.0" ] || fail "SONAME is '$soname'"

exports=$(nm -D --defined-only "$so" | awk '$2 ~ /^[TWDBVR]$/ {print $3}' | sort)
for sym in malloc calloc realloc free posix_memalign aligned_alloc memalign valloc pvalloc \
           malloc_usable_size mallctl rdmalloc_lookup rdmalloc_add_pd rdmalloc_remove_pd \
           rdmalloc_backend rdmalloc_dma_read rdmalloc_dma_write rdmalloc_stats _Znwm _ZdlPv \
           malloc_trim mallinfo mallinfo2 mallopt malloc_info malloc_stats \
           ibv_reg_mr ibv_reg_mr_iova ibv_reg_mr_iova2 ibv_rereg_mr ibv_dereg_mr ibv_dealloc_pd; do
  grep -qx "$sym" <<<"$exports" || fail "$so does not export $sym"
done
# Nothing else: no jemalloc internals (je_*), no rdmalloc C++ internals, no
# libibverbs function but the registration calls it interposes.
unexpected=$(grep -Ev '^(malloc|calloc|realloc|free|posix_memalign|aligned_alloc|memalign|valloc|pvalloc|malloc_usable_size|malloc_trim|mallinfo|mallinfo2|mallopt|malloc_info|malloc_stats|mallocx|rallocx|xallocx|sallocx|dallocx|sdallocx|nallocx|mallctl|mallctlnametomib|mallctlbymib|malloc_stats_print|malloc_message|malloc_conf|rdmalloc_[a-z_]+|ibv_(reg_mr|reg_mr_iova|reg_mr_iova2|rereg_mr|dereg_mr|dealloc_pd)|_Znw.*|_Zna.*|_Zdl.*|_Zda.*)$' <<<"$exports")
[ -z "$unexpected" ] || fail "$so exports unexpected symbols: $(echo $unexpected)"

# Writable data that comes from the file is paged in from it, and the kernel
# maps up to 64 KiB of its neighbours with every first read (fault-around).
# One non-zero byte in the heap object put all 9 MB of it there, and a program
# that mallocs 100 bytes carried 100 KiB more than with jemalloc; zero-filled
# data (.bss) costs only the pages written. No initialised writable object
# may be that large (the largest are jemalloc's thread state and the options
# table, a few KiB; sanitizer builds add many small ones).
largest=$(nm -S --size-sort -C "$so" | awk '$3 ~ /^[dD]$/ {size = $2; name = $4} END {print size, name}')
largest_bytes=$((16#${largest%% *}))
[ "$largest_bytes" -le 65536 ] ||
  fail "initialised writable data holds a $largest_bytes-byte object (${largest#* }); at most 65536"
heap_type=$(nm -C "$so" | awk '$3 == "rdmalloc::g_heap" {print $2}')
[ "$heap_type" == "b" ] || [ "$heap_type" == "B" ] ||
  fail "rdmalloc::g_heap is not zero-initialised data (.bss): nm type '${heap_type:-none}'"

# What every program's start touches takes as few pages as it can, each a
# page fault (allocator/startup_data.h, heap.h): the small state sits in
# .data, whose page the loader has written already, and the heap starts on a
# page of its own, its start-up state at both ends of its tables.
for sym in rdmj_init_state rdmj_classes_in_use 'rdmalloc::(anonymous namespace)::g_verbose' \
    'rdmalloc::(anonymous namespace)::g_handlers'; do
  t=$(nm -C "$so" | awk -v s="$sym" '{n = $0; sub(/^[^ ]+ [^ ]+ /, "", n)} n == s {print $2}')
  [ "$t" == "d" ] || [ "$t" == "D" ] ||
    fail "$sym is not in .data (nm type '${t:-none}'): see allocator/startup_data.h"
done
# libgcc's CPU model (what target_clones and __builtin_cpu_supports use)
# brings a constructor that writes a .bss page of its own at every start.
if nm "$so" | grep -qw __cpu_model; then
  fail "the library links libgcc's __cpu_model: see ChooseCounts in allocator/region.cc"
fi
# The loader binds the library's imports at their first call, as with
# Debian's libjemalloc. Bound now (Bazel's default -z now), all 119 were
# looked up before main: 69 k more instructions than jemalloc in a program
# that mallocs 100 bytes, 3.4 % of all it runs.
if readelf -d "$so" | grep -Eq 'BIND_NOW|FLAGS_1.* NOW'; then
  fail "the library is linked with -z now (see librdmalloc.so in allocator/BUILD)"
fi
# .bss begins on the page where .data ends, which the loader writes anyway:
# crtstuff's `completed.0`, first in .bss and written at exit, cost two page
# faults there while the heap's page alignment made .bss start a page of
# its own (the heap is in .lbss now, allocator/heap.cc).
edata=$(nm "$so" | awk '$3 == "_edata" {print $1}')
bss=$(readelf -SW "$so" | awk '$2 == ".bss" {print $4}')
[ -n "$edata" ] && [ -n "$bss" ] && [ $((16#$bss / 4096)) -eq $((16#$edata / 4096)) ] ||
  fail ".bss (at 0x${bss:-none}) does not begin on .data's last page (_edata 0x${edata:-none})"
heap_addr=$(nm -C "$so" | awk '$3 == "rdmalloc::g_heap" {print $1}')
[ -n "$heap_addr" ] && [ $((16#$heap_addr % 4096)) -eq 0 ] ||
  fail "rdmalloc::g_heap is not page-aligned (at 0x${heap_addr:-none})"

if [ "$failures" -ne 0 ]; then
  echo "$failures check(s) failed"
  exit 1
fi
echo "packaging checks passed"
