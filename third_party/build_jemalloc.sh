#!/bin/bash
# jemalloc's position-independent archive for rdmalloc: Debian's source and
# configuration (jemalloc_source.sh) with jemalloc_rdmalloc.patch, which lets
# malloc, free, new and delete be jemalloc's own fast paths with no rdmalloc
# wrapper in front of them, and gives every arena rdmalloc's eager-return
# size. About 1.5 CPU-minutes.
#
#   build_jemalloc.sh PATCH OUT.a
set -euo pipefail
here=$(dirname "$(realpath "$0")")
patch_file=$(realpath "$1")
out=$(realpath -m "$2")
work=$(mktemp -d /tmp/rdm-jemalloc-pic.XXXXXX)
trap 'rm -rf "$work"' EXIT
"$here/jemalloc_source.sh" "$work" "$patch_file"
make -C "$work/src" -j"$(nproc)" lib/libjemalloc_pic.a >>"$work/build.log" 2>&1 || {
  tail -50 "$work/build.log" >&2; echo "build_jemalloc: make lib/libjemalloc_pic.a failed" >&2; exit 1; }
cp "$work/src/lib/libjemalloc_pic.a" "$out"
