#!/bin/bash
# rdmalloc-run [-- ] COMMAND...: runs COMMAND with rdmalloc preloaded and
# prints rdmalloc's report when it exits. RDMALLOC_* settings pass through;
# RDMALLOC_STATS defaults to 1 (a short human report on stderr).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
lib=""
for candidate in "${RUNFILES_DIR:-$0.runfiles}/rdmalloc/allocator/librdmalloc.so" \
                 "$here/../allocator/librdmalloc.so" "$here/../lib/librdmalloc.so"; do
  if [ -f "$candidate" ]; then lib="$(cd "$(dirname "$candidate")" && pwd)/librdmalloc.so"; break; fi
done
[ -n "$lib" ] || { echo "rdmalloc-run: cannot find librdmalloc.so" >&2; exit 127; }
[ "${1:-}" == "--" ] && shift
[ $# -gt 0 ] || { echo "usage: rdmalloc-run [--] COMMAND [ARGS...]" >&2; exit 2; }
# `bazel run` starts us in the runfiles tree; run the command where the user is.
cd "${BUILD_WORKING_DIRECTORY:-.}"
export RDMALLOC_STATS="${RDMALLOC_STATS:-1}"
export LD_PRELOAD="$lib${LD_PRELOAD:+:$LD_PRELOAD}"
exec "$@"
