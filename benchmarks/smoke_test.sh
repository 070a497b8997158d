#!/bin/bash
# Runs every benchmark for a moment: each must start, run and print results.
# Numbers are not checked here (benchmarks are not tests); see run.py.
set -eu
lib="$(cd "$(dirname "$1")" && pwd)/$(basename "$1")"; shift
lookup="$1"; shift
message_path="$1"; shift
out=$("$lookup" --benchmark_min_time=0.01 --benchmark_filter='BM_LookupHit/64/threads:1|NotOurs|BM_LookupRandom/threads:1' 2>&1)
grep -q 'BM_LookupHit/64' <<<"$out" && grep -q 'BM_LookupMissNotOurs' <<<"$out" && grep -q 'BM_LookupRandom' <<<"$out"
out=$("$message_path" --benchmark_min_time=0.01 --benchmark_filter='FreshBuffer_.*/65536' 2>&1)
for kind in Rdmalloc RegPerMsg UcxRcache; do
  grep -q "BM_FreshBuffer_$kind/65536" <<<"$out" || { echo "$out"; exit 1; }
done
if grep -q 'ERROR OCCURRED' <<<"$out"; then echo "$out"; exit 1; fi
# The allocator workloads, briefly, under rdmalloc: each prints its one line.
for workload in "$@"; do
  line=$(LD_PRELOAD="$lib" "$workload" 2 0.05)
  echo "$line"
  grep -q '^workload=.* ops_per_s=' <<<"$line"
done
echo "benchmark smoke checks passed"
