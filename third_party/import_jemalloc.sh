#!/bin/bash
# Imports Debian's jemalloc archive for rdmalloc: import_jemalloc.sh IN.a RENAMES OUT.a
#  - every member: the symbols in RENAMES (the malloc family and C++
#    new/delete become rdmj_*, so that rdmalloc's wrappers own the public
#    names; pthread_atfork lands in rdmalloc's fork protocol);
#  - every member but arena.pic.o, which defines it: arena_config_default, what
#    jemalloc makes every arena with, becomes rdmalloc's rdmj_arena_config
#    (rdmalloc's hooks; allocator/extent_hooks.cc);
#  - jemalloc.pic.o, its only caller: base_boot becomes rdmalloc's
#    rdmj_base_boot, which gives base 0, and so arena 0, rdmalloc's hooks
#    before jemalloc maps its first extent.
set -euo pipefail
in=$1
renames=$2
out=$3
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
members=$(ar t "$in")
ar x --output="$work" "$in"
for m in $members; do
  objcopy --redefine-syms="$renames" "$work/$m"
  if [ "$m" != arena.pic.o ]; then
    objcopy --redefine-sym je_arena_config_default=rdmj_arena_config "$work/$m"
  fi
done
objcopy --redefine-sym je_base_boot=rdmj_base_boot "$work/jemalloc.pic.o"
(cd "$work" && ar rcs out.a $members)
mv "$work/out.a" "$out"
