#!/bin/bash
# rdmalloc-run [options] [--] COMMAND [ARGS...]
# Runs COMMAND with rdmalloc preloaded and the chosen settings, and shows
# rdmalloc's report when it exits. --NAME=VALUE sets RDMALLOC_NAME=VALUE for
# every setting of allocator/options.h (docs/TUNING.md), which
# rdmalloc_options lists (and prints for --help); variables already in the
# environment pass through.
set -euo pipefail

usage() {
  cat <<'USAGE'
usage: rdmalloc-run [options] [--] COMMAND [ARGS...]
Runs COMMAND with rdmalloc preloaded and shows rdmalloc's report when it exits:
on stderr, or in --stats-file; --stats=1 is the default here. Each
--NAME=VALUE sets RDMALLOC_NAME=VALUE; variables already in the environment
pass through. --help prints this.
USAGE
}

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
runfiles="${RUNFILES_DIR:-$0.runfiles}/rdmalloc"
# In order: bazel run/test (runfiles), an installed tree, bazel-bin itself.
find_file() {  # NAME RUNFILES_PATH INSTALLED_PATH BAZEL_BIN_PATH
  local candidate
  for candidate in "$runfiles/$2" "$here/$3" "$here/$4"; do
    if [ -f "$candidate" ]; then echo "$(cd "$(dirname "$candidate")" && pwd)/$(basename "$candidate")"; return; fi
  done
  echo "rdmalloc-run: cannot find $1" >&2
  exit 127
}
lib="$(find_file librdmalloc.so allocator/librdmalloc.so ../lib/librdmalloc.so ../allocator/librdmalloc.so)"
# The settings, from their one table (allocator/options.h): looked for only
# when an option or --help needs them.
options=""
known=""
find_options() {
  if [ -z "$options" ]; then
    options="$(find_file rdmalloc_options tools/rdmalloc_options ../libexec/rdmalloc/rdmalloc_options rdmalloc_options)"
  fi
}

export RDMALLOC_STATS="${RDMALLOC_STATS:-1}"
while [ $# -gt 0 ]; do
  case "$1" in
    --) shift; break ;;
    --help|-h) find_options; usage; "$options" --text; exit 0 ;;
    --?*=*)
      # --region-size=64M sets RDMALLOC_REGION_SIZE=64M
      name="${1%%=*}"; name="${name#--}"; name="RDMALLOC_$(tr 'a-z-' 'A-Z_' <<<"$name")"
      if [ -z "$known" ]; then find_options; known="$("$options" --names)"; fi
      if ! grep -qx -- "$name" <<<"$known"; then
        echo "rdmalloc-run: unknown option ${1%%=*} (rdmalloc-run --help lists them)" >&2; exit 2
      fi
      export "$name=${1#*=}" ;;
    -*) echo "rdmalloc-run: unknown option $1 (rdmalloc-run --help lists them)" >&2; exit 2 ;;
    *) break ;;
  esac
  shift
done
[ $# -gt 0 ] || { usage >&2; exit 2; }
# `bazel run` starts us in the runfiles tree; run the command where the user is.
cd "${BUILD_WORKING_DIRECTORY:-.}"
export LD_PRELOAD="$lib${LD_PRELOAD:+:$LD_PRELOAD}"
exec "$@"
