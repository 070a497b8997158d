#!/bin/bash
# librdmalloc.so exports rdmalloc_notify_ucx/_libfabric but loads without UCX
# or libfabric: both are found at run time.
set -euo pipefail
lib=$1
fail=0
needed=$(readelf -d "$lib" | grep NEEDED || true)
echo "$needed"
if grep -Eq 'libucm|libucs|libuct|libucp|libfabric' <<<"$needed"; then
  echo "FAIL: $lib links UCX or libfabric"; fail=1
fi
for sym in rdmalloc_notify_ucx rdmalloc_notify_libfabric rdmalloc_on_release rdmalloc_on_release_remove; do
  if ! nm -D --defined-only "$lib" | grep -qw "$sym"; then
    echo "FAIL: $lib does not export $sym"; fail=1
  fi
done
[ $fail -eq 0 ] && echo PASS
exit $fail
