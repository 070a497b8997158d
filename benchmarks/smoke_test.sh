#!/bin/bash
# Runs each benchmark for a moment: they must start, run and print results.
set -eu
churn="$1"; lookup="$2"; lib="$(cd "$(dirname "$3")" && pwd)/$(basename "$3")"
out=$(LD_PRELOAD="$lib" "$churn" 2 20000)
echo "$out"
grep -q 'mops_per_s=' <<<"$out"
out=$("$lookup" --benchmark_min_time=0.01 --benchmark_filter='BM_LookupHit/64/threads:1|NotOurs' 2>&1)
echo "$out"
grep -q 'BM_LookupHit/64' <<<"$out"
grep -q 'BM_LookupMissNotOurs' <<<"$out"
