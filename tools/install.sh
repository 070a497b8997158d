#!/bin/bash
# bazel run //tools:install -- --prefix=DIR
# Lays out lib/librdmalloc.so{,.0}, lib/librdmalloc.a (and the interposer,
# lib/librdmalloc_interpose.a), include/rdmalloc.h,
# bin/rdmalloc-run (with its helper libexec/rdmalloc/rdmalloc_options, which
# knows the settings) and lib/pkgconfig/rdmalloc.pc under DIR.
set -euo pipefail
prefix=""
for arg in "$@"; do
  case "$arg" in
    --prefix=*) prefix="${arg#*=}" ;;
    *) echo "usage: install --prefix=DIR" >&2; exit 2 ;;
  esac
done
[ -n "$prefix" ] || { echo "usage: install --prefix=DIR" >&2; exit 2; }
case "$prefix" in /*) ;; *) prefix="${BUILD_WORKING_DIRECTORY:-$PWD}/$prefix" ;; esac

runfiles="${RUNFILES_DIR:-$0.runfiles}/rdmalloc"
install -d "$prefix/lib/pkgconfig" "$prefix/include" "$prefix/bin" "$prefix/libexec/rdmalloc"
install -m 0755 "$runfiles/allocator/librdmalloc.so" "$prefix/lib/librdmalloc.so.0"
ln -sf librdmalloc.so.0 "$prefix/lib/librdmalloc.so"
install -m 0644 "$runfiles/allocator/librdmalloc.a" "$prefix/lib/librdmalloc.a"
install -m 0644 "$runfiles/allocator/librdmalloc_interpose.a" "$prefix/lib/librdmalloc_interpose.a"
install -m 0644 "$runfiles/allocator/rdmalloc.h" "$prefix/include/rdmalloc.h"
install -m 0755 "$runfiles/tools/rdmalloc-run.sh" "$prefix/bin/rdmalloc-run"
install -m 0755 "$runfiles/tools/rdmalloc_options" "$prefix/libexec/rdmalloc/rdmalloc_options"
sed "s|@PREFIX@|$prefix|" "$runfiles/tools/rdmalloc.pc.in" > "$prefix/lib/pkgconfig/rdmalloc.pc"
echo "installed rdmalloc into $prefix"
