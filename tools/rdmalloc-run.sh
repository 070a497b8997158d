#!/bin/bash
# rdmalloc-run [options] [--] COMMAND [ARGS...]
# Runs COMMAND with rdmalloc preloaded and the chosen settings, and shows
# rdmalloc's report when it exits. Options set the RDMALLOC_* variables
# (docs/TUNING.md); variables already in the environment pass through.
set -euo pipefail

usage() {
  cat <<'USAGE'
usage: rdmalloc-run [options] [--] COMMAND [ARGS...]
  --backend=auto|verbs|uring|none   --device=NAME        --register=lazy|eager
  --region-size=SIZE                --access=LIST        --max-pinned=SIZE|unlimited
  --decay-ms=MS                     --stats=1|json|0     --stats-file=PATH
  --verbose=0|1|2|3                 --notify=ucx,libfabric   --help
The report goes to stderr (or --stats-file) when COMMAND exits; --stats=1 is the default.
USAGE
}

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
lib=""
for candidate in "${RUNFILES_DIR:-$0.runfiles}/rdmalloc/allocator/librdmalloc.so" \
                 "$here/../lib/librdmalloc.so" "$here/../allocator/librdmalloc.so"; do
  if [ -f "$candidate" ]; then lib="$(cd "$(dirname "$candidate")" && pwd)/librdmalloc.so"; break; fi
done
[ -n "$lib" ] || { echo "rdmalloc-run: cannot find librdmalloc.so" >&2; exit 127; }

export RDMALLOC_STATS="${RDMALLOC_STATS:-1}"
while [ $# -gt 0 ]; do
  case "$1" in
    --) shift; break ;;
    --help|-h) usage; exit 0 ;;
    --backend=*) export RDMALLOC_BACKEND="${1#*=}" ;;
    --device=*) export RDMALLOC_DEVICE="${1#*=}" ;;
    --register=*) export RDMALLOC_REGISTER="${1#*=}" ;;
    --region-size=*) export RDMALLOC_REGION_SIZE="${1#*=}" ;;
    --access=*) export RDMALLOC_ACCESS="${1#*=}" ;;
    --max-pinned=*) export RDMALLOC_MAX_PINNED="${1#*=}" ;;
    --decay-ms=*) export RDMALLOC_DECAY_MS="${1#*=}" ;;
    --stats=*) export RDMALLOC_STATS="${1#*=}" ;;
    --stats-file=*) export RDMALLOC_STATS_FILE="${1#*=}" ;;
    --verbose=*) export RDMALLOC_VERBOSE="${1#*=}" ;;
    --notify=*) export RDMALLOC_NOTIFY="${1#*=}" ;;
    -*) echo "rdmalloc-run: unknown option $1" >&2; usage >&2; exit 2 ;;
    *) break ;;
  esac
  shift
done
[ $# -gt 0 ] || { usage >&2; exit 2; }
# `bazel run` starts us in the runfiles tree; run the command where the user is.
cd "${BUILD_WORKING_DIRECTORY:-.}"
export LD_PRELOAD="$lib${LD_PRELOAD:+:$LD_PRELOAD}"
exec "$@"
