#!/bin/bash
# Imports jemalloc's archive for rdmalloc:
#   import_jemalloc.sh IN.a RENAMES OUT.a [ENTRY_POINTS]
#  - every member: the symbols in RENAMES (the malloc family and C++
#    new/delete become rdmj_*, for rdmalloc to call; pthread_atfork lands in
#    rdmalloc's fork protocol);
#  - the names in ENTRY_POINTS, if given (malloc, free, new, delete, ...) are then
#    given back to jemalloc's functions as weak aliases of their rdmj_*
#    names: the program calls jemalloc's fast paths directly. Weak, so that a
#    build with RDMALLOC_WITNESS can put its checking wrappers in front;
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
entry_points=${4:-/dev/null}
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
for m in jemalloc.pic.o jemalloc_cpp.pic.o; do
  # "VALUE g F SECTION SIZE NAME" for every function this member defines.
  table=$(objdump -t "$work/$m")
  aliases=()
  while read -r name; do
    line=$(awk -v n="rdmj_$name" '$NF == n && $3 == "F"' <<<"$table")
    [ -n "$line" ] || continue
    read -r value _ _ section _ <<<"$line"
    aliases+=(--add-symbol "$name=$section:0x$value,weak,function")
  done <"$entry_points"
  [ ${#aliases[@]} -eq 0 ] || objcopy "${aliases[@]}" "$work/$m"
done
defined=$(nm "$work"/*.o 2>/dev/null)
for name in $(cat "$entry_points"); do
  grep -q " W $name\$" <<<"$defined" || {
    echo "import_jemalloc: no jemalloc function for $name" >&2; exit 1; }
done
(cd "$work" && ar rcs out.a $members)
mv "$work/out.a" "$out"
