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
# RDMALLOC_NOTIFY: a preloaded rdmalloc tells UCX and libfabric by itself in a
# program that links neither (python3 here), before main runs.
out=$(RDMALLOC_VERBOSE=1 RDMALLOC_NOTIFY=ucx,libfabric LD_PRELOAD="$lib" python3 -c '
import ctypes
class Stats(ctypes.Structure):
    _fields_ = [("words", ctypes.c_uint64 * 512)]
lib = ctypes.CDLL(None)
s = Stats()
assert lib.rdmalloc_stats(ctypes.byref(s), ctypes.c_size_t(ctypes.sizeof(s))) == 0
print("loaded", all(ctypes.CDLL(n, mode=4).rdmalloc_stats is not None for n in []),
      ctypes.CDLL("libucm.so.0", mode=4 | ctypes.RTLD_GLOBAL) is not None,
      ctypes.CDLL("libfabric.so.1", mode=4 | ctypes.RTLD_GLOBAL) is not None)
' 2>&1) || { echo "FAIL: RDMALLOC_NOTIFY run: $out"; fail=1; }
echo "$out"
grep -q "UCX hears of released memory" <<<"$out" || { echo "FAIL: RDMALLOC_NOTIFY=ucx"; fail=1; }
grep -q "libfabric hears of released memory" <<<"$out" || { echo "FAIL: RDMALLOC_NOTIFY=libfabric"; fail=1; }
grep -q "^loaded True True True" <<<"$out" || { echo "FAIL: UCX/libfabric not loaded"; fail=1; }
# python3 here is a non-PIE program whose malloc symbol is its own PLT entry:
# rdmalloc still serves it, and must not claim otherwise.
if grep -q "another malloc serves the process" <<<"$out"; then
  echo "FAIL: false 'another malloc' note under LD_PRELOAD"; fail=1
fi
[ $fail -eq 0 ] && echo PASS
exit $fail
