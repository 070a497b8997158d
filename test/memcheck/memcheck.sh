#!/bin/bash
# Runs one test binary under valgrind's memcheck: invalid reads and writes,
# uses of uninitialised memory, bad frees and definite leaks fail the test.
# ASan cannot be used (it replaces malloc, as rdmalloc does); this covers the
# allocator's parts that do not replace malloc. See docs/TESTING.md.
set -uo pipefail
if ! command -v valgrind >/dev/null; then
  echo "################################################################"
  echo "# SKIPPED: valgrind is not installed (bash tools/setup.sh)       #"
  echo "################################################################"
  [ "${CI:-}" = "true" ] && exit 1
  exit 0
fi
# The wrapped gtest binary must not write test.xml: Bazel then records this
# script's exit status, which is valgrind's verdict.
unset GTEST_OUTPUT XML_OUTPUT_FILE
exec valgrind --quiet --error-exitcode=99 --leak-check=full --errors-for-leak-kinds=definite \
  --show-leak-kinds=definite "$@"
