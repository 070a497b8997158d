#!/bin/bash
# Quick side-by-side: the same malloc_churn binary under glibc, stock Debian
# jemalloc and rdmalloc, interleaved A B C A B C, median of N runs, printed as
# a table with ratios; then the lookup latency. Usage: run_quick.sh [rounds]
set -euo pipefail
cd "$(dirname "$0")/.."
rounds="${1:-5}"
bazel build -c opt //benchmarks:malloc_churn //benchmarks:lookup_benchmark //allocator:librdmalloc.so >/dev/null 2>&1
bin="$(pwd)/.bazel/bin"
churn="$bin/benchmarks/malloc_churn"
rdm="$bin/allocator/librdmalloc.so"
jem="$(ls /usr/lib/*/libjemalloc.so.2 | head -1)"
declare -A results
for threads in 1 2; do
  for r in $(seq "$rounds"); do
    for alloc in glibc jemalloc rdmalloc; do
      case $alloc in glibc) pre="" ;; jemalloc) pre="$jem" ;; rdmalloc) pre="$rdm" ;; esac
      v=$(LD_PRELOAD="$pre" "$churn" "$threads" 2000000 | sed 's/.*mops_per_s=//')
      results[$alloc,$threads]="${results[$alloc,$threads]:-} $v"
    done
  done
done
median() { tr ' ' '\n' | grep -v '^$' | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
echo "malloc_churn, Mops/s (median of $rounds interleaved runs)"
printf "%-8s %10s %10s %10s %14s %14s\n" threads glibc jemalloc rdmalloc rdm/jemalloc rdm/glibc
for threads in 1 2; do
  g=$(median <<<"${results[glibc,$threads]}")
  j=$(median <<<"${results[jemalloc,$threads]}")
  d=$(median <<<"${results[rdmalloc,$threads]}")
  printf "%-8s %10s %10s %10s %14.3f %14.3f\n" "$threads" "$g" "$j" "$d" \
    "$(awk -v a="$d" -v b="$j" 'BEGIN{print a/b}')" "$(awk -v a="$d" -v b="$g" 'BEGIN{print a/b}')"
done
echo
"$bin/benchmarks/lookup_benchmark" --benchmark_repetitions=3 --benchmark_report_aggregates_only=true
