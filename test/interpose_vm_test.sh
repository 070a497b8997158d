#!/bin/bash
# Inside the VM: the unmodified verbs program (interpose_vm_test.cc) three
# ways. interpose_vm_test.sh PROGRAM LIBRDMALLOC
set -u
prog=$1
lib=$2
failed=0
run() {
  echo "=== $1"
  shift
  if "$@"; then echo "=== ok"; else echo "=== FAILED (exit $?)"; failed=$((failed + 1)); fi
}
run "rdmalloc, RDMALLOC_ACCESS widened: heap registrations served" \
  env LD_PRELOAD="$lib" RDMALLOC_BACKEND=verbs RDMALLOC_ACCESS=local_write,remote_read,remote_write \
  RDMALLOC_DECAY_MS=0 RDMALLOC_STATS=1 "$prog" --expect=served --cycles=60 --after-free
run "rdmalloc, default access (local only): remote requests forwarded" \
  env LD_PRELOAD="$lib" RDMALLOC_BACKEND=verbs RDMALLOC_DECAY_MS=0 RDMALLOC_STATS=1 \
  "$prog" --expect=forwarded --cycles=60 --after-free
run "negative control, no rdmalloc: every registration reaches the kernel" \
  "$prog" --expect=forwarded --cycles=30
echo "interpose_vm_test: $failed of 3 runs failed"
[ "$failed" -eq 0 ]
