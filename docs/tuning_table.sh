#!/bin/bash
# docs/TUNING.md's settings table is generated from allocator/options.h, the
# one table of RDMALLOC_* settings, by //tools:rdmalloc_options --markdown.
#   tuning_table.sh check OPTIONS TUNING.md README.md
#     (//docs:tuning_table_test) fails, printing a diff, when the doc's table
#     is not what OPTIONS generates, or when README.md's Settings section does
#     not name exactly the settings, in the table's order.
#   tuning_table.sh update OPTIONS [TUNING.md]
#     (bazel run //docs:update_tuning_table) rewrites the table in TUNING.md,
#     by default the workspace's docs/TUNING.md.
# The table stands between two marker lines; the rest of the doc is hand-written.
set -euo pipefail
mode=${1:-} options=${2:-}
begin='<!-- settings table: generated from allocator/options.h by bazel run //docs:update_tuning_table -->'
end='<!-- end of the generated settings table -->'
usage() { echo "usage: tuning_table.sh check OPTIONS TUNING.md README.md | update OPTIONS [TUNING.md]" >&2; exit 2; }
[ -n "$options" ] || usage
tmp=$(mktemp -d "${TEST_TMPDIR:-${TMPDIR:-/tmp}}/tuning_table.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
# What stands between the markers: the table, a blank line either side.
{ echo; "$options" --markdown; echo; } > "$tmp/generated"

markers_once() {  # DOC
  local n marker
  for marker in "$begin" "$end"; do
    n=$(grep -cxF -- "$marker" "$1" || true)
    if [ "$n" -ne 1 ]; then
      echo "FAIL: $1 must hold this marker line exactly once (it holds it $n times):"
      echo "  $marker"
      return 1
    fi
  done
}

case "$mode" in
  check)
    [ $# -eq 4 ] || usage
    doc=$3 readme=$4 failed=0
    markers_once "$doc" || exit 1
    awk -v b="$begin" -v e="$end" '$0 == e { inside = 0 } inside { print } $0 == b { inside = 1 }' \
      "$doc" > "$tmp/doc"
    if ! diff -u --label "generated from allocator/options.h" --label "docs/TUNING.md" \
        "$tmp/generated" "$tmp/doc"; then
      echo "FAIL: docs/TUNING.md's settings table differs from allocator/options.h (diff above:"
      echo "  - generated, + the doc). Change the table in allocator/options.h, then"
      echo "  bazel run //docs:update_tuning_table"
      failed=1
    fi
    "$options" --names > "$tmp/names"
    awk '/^## / { inside = ($0 == "## Settings") } inside' "$readme" |
      { grep -o '`RDMALLOC_[A-Z_]*`' || true; } | tr -d '`' > "$tmp/readme_names"
    if ! diff -u --label "allocator/options.h" --label "README.md's Settings section" \
        "$tmp/names" "$tmp/readme_names"; then
      echo "FAIL: README.md's Settings section must name every setting of allocator/options.h"
      echo "  once, in its order (diff above)"
      failed=1
    fi
    [ "$failed" -eq 0 ] && echo "docs/TUNING.md's settings table and README.md's list match allocator/options.h"
    exit "$failed"
    ;;
  update)
    [ $# -le 3 ] || usage
    doc=${3:-${BUILD_WORKSPACE_DIRECTORY:?run me with bazel run //docs:update_tuning_table}/docs/TUNING.md}
    markers_once "$doc" || exit 1
    awk -v b="$begin" -v e="$end" -v gen="$tmp/generated" '
      $0 == e { inside = 0 }
      !inside { print }
      $0 == b { inside = 1; while ((getline line < gen) > 0) print line }
    ' "$doc" > "$tmp/new"
    if cmp -s "$tmp/new" "$doc"; then
      echo "$doc: the settings table is up to date"
    else
      cat "$tmp/new" > "$doc"
      echo "$doc: the settings table is rewritten from allocator/options.h"
    fi
    ;;
  *) usage ;;
esac
