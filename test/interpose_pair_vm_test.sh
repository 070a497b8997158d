#!/bin/bash
# In VM 1 of test/vm/run_pair.sh: the unmodified verbs program of
# //test:interpose_vm_test (interpose_vm_test.cc) as process A, here, with its
# peer B in VM 2 (started through the pair's rsh, glibc's malloc), over RC on
# rxe0 across the virtual link. A checks every byte and counts its kernel
# registrations itself (VmPin); rdmalloc's report (RDMALLOC_STATS=1) says how
# many of A's ibv_reg_mr calls it served and forwarded.
#
#   interpose_pair_vm_test.sh PROGRAM LIBRDMALLOC [CYCLES]
set -u
prog=$(realpath "$1")
lib=$(realpath "$2")
cycles=${3:-60}
port=18515
work=$(mktemp -d /tmp/interpose-pair.XXXXXX) || exit 1
trap 'rm -rf "$work"' EXIT
# Stopped by the VM's watchdog (a hung run): what A and B had printed so far.
current=
stopped() {
  echo "interpose_pair_vm_test: stopped during: ${current:-setup}"
  for f in a a.err b; do [ -s "$work/$f" ] && sed "s/^/  $f: /" "$work/$f"; done
  exit 124
}
trap stopped TERM
failed=0
fail() { echo "FAIL: $*"; failed=$((failed + 1)); }

# exit_if_link_down WHY: a failed or stuck run whose peer guest cannot be reached
# saw the emulated link between the guests die: exit 75, and vm_test.sh runs the
# pair once more (docs/TESTING.md, "A hung VM test says where it hung").
exit_if_link_down() {
  python3 "$SOFTROCE_PAIR_RSH" --probe "$SOFTROCE_PAIR_PEER" && return 0
  echo "LINK DOWN: $1, and $SOFTROCE_PAIR_PEER:7070 cannot be reached: the emulated link" \
    "between the guests stopped carrying packets. This guest's last kernel messages:"
  dmesg | tail -n 20 | sed 's/^/  kernel: /'
  exit 75
}

# pair_run LABEL CMD...: A is CMD --listen=PORT here, B the peer in VM 2. Sets
# a_rc, b_rc; A's stdout then stderr in $work/a, B's output in $work/b.
pair_run() {
  local label=$1 b_pid end
  shift
  current=$label
  : >"$work/a"; : >"$work/a.err"; : >"$work/b"
  echo "=== $label"
  python3 "$SOFTROCE_PAIR_RSH" "$SOFTROCE_PAIR_PEER" \
    "echo \"B on \$(hostname)\"; exec env -u LD_PRELOAD $(printf %q "$prog") --role=peer --connect=$SOFTROCE_PAIR_SELF:$port" \
    >"$work/b" 2>&1 &
  b_pid=$!
  "$@" --listen=$port >"$work/a" 2>"$work/a.err"
  a_rc=$?
  cat "$work/a.err" >>"$work/a"   # rdmalloc's report after the program's own lines
  # B ends within seconds of A (bye, or A's connection closing).
  end=$((SECONDS + 90))
  while kill -0 "$b_pid" 2>/dev/null && ((SECONDS < end)); do sleep 0.5; done
  if kill -0 "$b_pid" 2>/dev/null; then
    sed 's/^/  A: /' "$work/a"
    sed 's/^/  B so far: /' "$work/b"
    exit_if_link_down "90 s after A exited ($a_rc), B's launcher still waits"
    echo "  B still runs 90 s after A exited ($a_rc), on a live link; where it is:"
    timeout 60 python3 "$SOFTROCE_PAIR_RSH" "$SOFTROCE_PAIR_PEER" 'bash "$SOFTROCE_VM_STACKS"'
    kill "$b_pid"
    wait "$b_pid"
    b_rc=124
  else
    wait "$b_pid"
    b_rc=$?
    sed 's/^/  A: /' "$work/a"
    sed 's/^/  B: /' "$work/b"
  fi
  echo "  A exited $a_rc, B exited $b_rc"
  [ "$a_rc" -eq 0 ] && [ "$b_rc" -eq 0 ] || exit_if_link_down "A exited $a_rc, B exited $b_rc"
}

# The two processes really were on the two machines, and both finished well.
check_pair() {
  grep -q "^A on rdmalloc-vm1: B connected from $SOFTROCE_PAIR_PEER\$" "$work/a" ||
    fail "$1: A was not in vm1 with B connecting from $SOFTROCE_PAIR_PEER"
  grep -q '^B on rdmalloc-vm2$' "$work/b" || fail "$1: B did not run in vm2"
  [ "$a_rc" -eq 0 ] && grep -q '^PASS$' "$work/a" || fail "$1: A failed"
  grep -q "^peer: served $((cycles + 1)) cycles, exiting 0\$" "$work/b" && [ "$b_rc" -eq 0 ] ||
    fail "$1: B did not serve $((cycles + 1)) cycles and exit 0"
}

# rdmalloc's report line: "ibv_reg_mr   S served from the heap's registrations, F forwarded ..."
check_report() {  # LABEL SERVED FORWARDED
  local line
  line=$(grep -m1 '^  ibv_reg_mr ' "$work/a")
  [[ $line =~ ibv_reg_mr\ +([0-9]+)\ served[^,]*,\ ([0-9]+)\ forwarded ]] &&
    [ "${BASH_REMATCH[1]}" -eq "$2" ] && [ "${BASH_REMATCH[2]}" -eq "$3" ] ||
    fail "$1: expected $2 served and $3 forwarded in vm1, report says: ${line:-nothing}"
}

env_rd=(env LD_PRELOAD="$lib" RDMALLOC_BACKEND=verbs RDMALLOC_DECAY_MS=0 RDMALLOC_STATS=1)
# Each run makes CYCLES registrations plus one for the after-free phase.
pair_run "rdmalloc, RDMALLOC_ACCESS widened: heap registrations served in vm1" \
  "${env_rd[@]}" RDMALLOC_ACCESS=local_write,remote_read,remote_write \
  "$prog" --expect=served --cycles="$cycles" --after-free
check_pair served
check_report served $((cycles + 1)) 0

pair_run "rdmalloc, default access (local only): remote requests forwarded" \
  "${env_rd[@]}" "$prog" --expect=forwarded --cycles="$cycles" --after-free
check_pair forwarded
check_report forwarded 0 $((cycles + 1))

# Negative control: without rdmalloc, A expecting its registrations served
# must see them reach the kernel after warm-up, and fail.
pair_run "negative control, no rdmalloc, --expect=served: must fail" \
  "$prog" --expect=served --cycles=12
if [ "$a_rc" -ne 1 ] || ! grep -q 'heap buffers registered in the kernel after warm-up' "$work/a"; then
  fail "negative control: A did not fail on its kernel registrations (exit $a_rc)"
fi

echo "interpose_pair_vm_test: $failed check(s) failed"
[ "$failed" -eq 0 ]
