#!/usr/bin/env bash
# Bazel test wrapper around a command that boots the soft-RoCE VM (run.sh, or a script
# that runs it). Passes the command's exit code through, except 125 ("vm: cannot
# start"): a machine that cannot boot the VM skips the test loudly, unless
# CI=true|1 (what .ci/run passes with --test_env) says this machine must run
# it, then it fails; and 75 (a pair's link died): the command runs once more.
#
#   vm_test.sh WHAT CMD [ARGS...]      e.g. vm_test.sh "real-verbs suite" test/vm/run.sh ...
set -uo pipefail
what=$1
shift
errlog=$(mktemp "${TEST_TMPDIR:-${TMPDIR:-/tmp}}/vm_test.stderr.XXXXXX")
# stdout straight through; stderr through tee, kept for the "vm: cannot start" reason.
# Sets rc to the command's exit code.
run_command() {
  { "$@" 2>&1 1>&3 3>&- | tee "$errlog" >&2 3>&-; } 3>&1
  rc=${PIPESTATUS[0]}
}
run_command "$@"
# 75: the command saw the emulated link between a pair's guests die (QEMU's socket
# netdev stops carrying one direction, rarely, under load). Not a result: the whole
# test runs once more on two fresh guests, and must pass there.
if [[ $rc -eq 75 ]]; then
  echo "******************************************************************************"
  echo "RERUN: $what: the link between the two guests died (exit 75, evidence above);"
  echo "running the whole test once more on two fresh guests"
  echo "******************************************************************************"
  run_command "$@"
  [[ $rc -ne 75 ]] || { echo "vm_test: $what: the link died again: a failure"; rc=1; }
fi
if [[ $rc -eq 125 ]]; then
  reason=$(grep -m1 '^vm: cannot start' "$errlog" | sed 's/^vm: cannot start:\{0,1\} *//')
  reason=${reason:-no reason given}
  if [[ ${CI:-} == true || ${CI:-} == 1 ]]; then
    echo "vm: cannot start: $reason ($what; CI=$CI, so this is a failure)"
    exit 1
  fi
  echo "******************************************************************************"
  echo "SKIPPED: $what: vm cannot start here ($reason)"
  echo "******************************************************************************"
  exit 0
fi
exit "$rc"
