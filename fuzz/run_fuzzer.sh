#!/bin/bash
# Runs one fuzz target over a copy of its seed corpus: libFuzzer for
# FUZZ_SECONDS (default 20) under --config=fuzz, or one replay of
# every seed in the plain build (fuzz/replay_main.cc). Any finding fails the
# test; libFuzzer saves the input under the test's undeclared outputs
# (bazel-testlogs/fuzz/<target>/test.outputs/).
set -euo pipefail
fuzzer=$1
seeds=$2
seconds=${FUZZ_SECONDS:-20}
work=$(mktemp -d "${TEST_TMPDIR:-/tmp}/corpus.XXXXXX")
cp "$seeds"/* "$work"/
artifacts=${TEST_UNDECLARED_OUTPUTS_DIR:-$work}
# -timeout: an input that hangs (a deadlock) is a finding too.
exec "$fuzzer" -max_total_time="$seconds" -timeout=10 -print_final_stats=1 \
  -artifact_prefix="$artifacts/" "$work"
