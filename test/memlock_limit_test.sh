#!/bin/bash
# Runs test/memlock_limit_test.cc as a process without CAP_IPC_LOCK under a
# RLIMIT_MEMLOCK of 8 MiB, twice: as user nobody (lazy registration), and as root
# with CAP_IPC_LOCK dropped from every set (eager registration, so that
# registrations also fail inside the allocation path).
# Usage: memlock_limit_test.sh TEST_BINARY
set -uo pipefail
bin=$1
# No CAP_SYS_RESOURCE here: the hard limit can only go down (8 MiB on
# Debian by default), so regions are kept small.
limit=$((8 << 20))
export RDMALLOC_REGION_SIZE=2M

skip() {
  echo "################################################################"
  echo "# SKIPPED: memlock_limit_test: $1"
  echo "################################################################"
  [ "${CI:-}" = true ] && exit 1
  exit 0
}
[ "$(id -u)" = 0 ] || skip "needs root to switch user and drop capabilities"
command -v setpriv >/dev/null && command -v prlimit >/dev/null || skip "needs setpriv and prlimit (util-linux)"

# Bazel's runfiles live under /root, which user nobody cannot enter.
dir=$(mktemp -d /tmp/rdmalloc-memlock.XXXXXX)
trap 'rm -rf "$dir"' EXIT
cp "$bin" "$dir/memlock_limit_test"
chmod 755 "$dir" "$dir/memlock_limit_test"

status=0
run() {
  local what=$1
  shift
  echo "=== $what"
  # The child's report is not Bazel's: it could not write it as nobody anyway.
  env -u XML_OUTPUT_FILE -u GTEST_OUTPUT -u TEST_PREMATURE_EXIT_FILE "$@" || {
    echo "=== FAILED: $what"
    status=1
  }
}
run "user nobody, lazy registration" \
  prlimit --memlock=$limit:$limit -- \
  setpriv --reuid=nobody --regid=nogroup --clear-groups -- "$dir/memlock_limit_test"
run "root without CAP_IPC_LOCK, eager registration" \
  RDMALLOC_REGISTER=eager prlimit --memlock=$limit:$limit -- \
  setpriv --inh-caps=-ipc_lock --bounding-set=-ipc_lock -- "$dir/memlock_limit_test"
exit $status
