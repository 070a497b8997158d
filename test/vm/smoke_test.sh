#!/usr/bin/env bash
# Smoke test for test/vm/run.sh: boots the soft-RoCE VM and checks that real verbs work
# (rxe0 present and ACTIVE, ibv_rc_pingpong, perftest, a loopback RDMA WRITE/READ of
# 8 MiB), that the caller's cwd/env/ulimit reach the command, that Bazel-style output
# dirs are writable from the guest, and that exit codes and the timeout come back.
# Prints PASS/FAIL per check; exits non-zero if any check fails.
#
# Usage: test/vm/smoke_test.sh        (as root, after test/vm/setup.sh)
# Also //test:vm_smoke_test (through test/vm/vm_test.sh). Exit 125 if the VM cannot start.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
RUN=$HERE/run.sh
T_BEGIN=${EPOCHREALTIME/[.,]/}
secs() { awk -v us="$1" 'BEGIN { printf "%.1f", us / 1e6 }'; }

# Under Bazel: inside the test's own TEST_TMPDIR.
tmp=$(mktemp -d "${TEST_TMPDIR:-${TMPDIR:-/tmp}}/rdmalloc-vm-smoke.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
passed=0
failed=0
expect() {  # NAME DETAIL CMD... : PASS if CMD succeeds
  local name=$1 detail=$2
  shift 2
  if "$@"; then result "$name" 0 "$detail"; else result "$name" 1 "$detail"; fi
}
result() {  # NAME OK(0/1) [detail]
  if [[ $2 -eq 0 ]]; then echo "PASS $1${3:+ ($3)}"; passed=$((passed + 1));
  else echo "FAIL $1${3:+ ($3)}"; failed=$((failed + 1)); fi
}

# Built on the host: the guest runs host binaries through the shared root.
gcc -O2 -Wall -o "$tmp/verbs_loopback" "$HERE/verbs_loopback.c" -libverbs

# --- Guest side: one boot runs all RDMA checks (each boot costs ~5 s under TCG). ---
cat >"$tmp/checks.sh" <<'EOF'
#!/bin/bash
set -uo pipefail
fails=0
log=$(mktemp)
check() {  # NAME CMD... ; prints PASS/FAIL with its duration, output on failure
  local name=$1 t0=${EPOCHREALTIME/[.,]/} rc=0
  shift
  "$@" >"$log" 2>&1 || rc=$?
  local dt=$(awk -v us=$(( ${EPOCHREALTIME/[.,]/} - t0 )) 'BEGIN { printf "%.1f", us / 1e6 }')
  if [[ $rc -eq 0 ]]; then
    echo "PASS $name (${dt} s)"
  else
    echo "FAIL $name (${dt} s, exit $rc)"
    sed 's/^/    | /' "$log" | tail -n 20
    fails=$((fails + 1))
  fi
}
# Starts SERVER in the background, waits for it to listen on PORT, runs CLIENT, and
# requires both to exit 0.  Usage: pair PORT SERVER... -- CLIENT...
pair() {
  local port=$1 server=() client=() i spid rc=0
  shift
  while [[ $1 != -- ]]; do server+=("$1"); shift; done
  shift
  client=("$@")
  timeout 60 "${server[@]}" >"$log.server" 2>&1 &
  spid=$!
  for ((i = 0; i < 400; i++)); do
    ss -Hltn "sport = :$port" | grep -q . && break
    kill -0 "$spid" 2>/dev/null || break
    sleep 0.05
  done
  timeout 60 "${client[@]}" || rc=$?
  wait "$spid" || { echo "server exited $?:"; cat "$log.server"; return 1; }
  cat "$log.server" | tail -n 3
  return $rc
}

check "ulimit -l is unlimited" test "$(ulimit -l)" = unlimited
check "runs in the caller's cwd ($PWD)" test "$PWD" = "$SMOKE_EXPECT_CWD"
check "caller env reaches the command" \
  test "${RDMALLOC_SMOKE_TOKEN:-}|${GTEST_SMOKE:-}|${LD_LIBRARY_PATH:-}" = "$SMOKE_EXPECT_ENV"
check "ibv_devices lists rxe0" sh -c 'ibv_devices | grep -qw rxe0'
check "ibv_devinfo -d rxe0 shows PORT_ACTIVE" sh -c 'ibv_devinfo -d rxe0 | grep -q PORT_ACTIVE'
check "ibv_rc_pingpong rxe0 over 127.0.0.1" \
  pair 18515 ibv_rc_pingpong -d rxe0 -g 0 -p 18515 -n 500 -- \
             ibv_rc_pingpong -d rxe0 -g 0 -p 18515 -n 500 127.0.0.1
check "ib_write_bw rxe0" \
  pair 18516 ib_write_bw -d rxe0 -x 0 -F -p 18516 -s 65536 -n 300 -- \
             ib_write_bw -d rxe0 -x 0 -F -p 18516 -s 65536 -n 300 127.0.0.1
check "ib_read_lat rxe0" \
  pair 18517 ib_read_lat -d rxe0 -x 0 -F -p 18517 -n 500 -- \
             ib_read_lat -d rxe0 -x 0 -F -p 18517 -n 500 127.0.0.1
check "verbs_loopback: 8 MiB RDMA WRITE+READ verified" "$SMOKE_DIR/verbs_loopback" -d rxe0 -g 0
# Written here, checked on the host after the VM is gone.
check "write into TEST_TMPDIR" sh -c 'echo tmpdir-ok > "$TEST_TMPDIR/from_guest"'
check "write XML_OUTPUT_FILE" sh -c 'echo "<testsuites/>" > "$XML_OUTPUT_FILE"'
rm -f "$log" "$log.server"
exit "$fails"
EOF

mkdir -p "$tmp/work"
cd "$tmp/work"   # run.sh must carry this cwd into the guest
token=smoke-$RANDOM-$$
echo "smoke: booting VM for the RDMA checks"
main_rc=0
# stderr is also kept to pick up run.sh's "vm: booted in ..." line.
SMOKE_DIR=$tmp SMOKE_EXPECT_CWD=$tmp/work \
  SMOKE_EXPECT_ENV="$token|yes|/nonexistent-smoke-lib" \
  RDMALLOC_SMOKE_TOKEN=$token GTEST_SMOKE=yes LD_LIBRARY_PATH=/nonexistent-smoke-lib \
  TEST_TMPDIR=$tmp/test_tmpdir XML_OUTPUT_FILE=$tmp/testlogs/test.xml \
  "$RUN" --timeout 170 bash "$tmp/checks.sh" > >(tee "$tmp/main.out") 2> >(tee "$tmp/main.err" >&2) ||
  main_rc=$?
wait  # for the tee processes
if [[ $main_rc -eq 125 ]]; then
  echo "smoke: $(grep -m1 '^vm: cannot start' "$tmp/main.err" || echo 'vm: cannot start')"
  exit 125
fi
passed=$((passed + $(grep -c '^PASS ' "$tmp/main.out" || true)))
failed=$((failed + $(grep -c '^FAIL ' "$tmp/main.out" || true)))
boot_line=$(grep '^vm: booted in' "$tmp/main.err" || true)
expect "guest checks script exited 0" "exit $main_rc" test "$main_rc" -eq 0
expect "TEST_TMPDIR write reached the host" "" \
  test "$(cat "$tmp/test_tmpdir/from_guest" 2>/dev/null)" = tmpdir-ok
expect "test.xml reached the host" "" \
  test "$(cat "$tmp/testlogs/test.xml" 2>/dev/null)" = "<testsuites/>"

echo "smoke: booting VM for exit code / stream checks"
rc=0
"$RUN" --timeout 60 sh -c 'echo to-stdout; echo to-stderr >&2; exit 7' >"$tmp/x.out" 2>"$tmp/x.err" || rc=$?
expect "exit code 7 comes back" "got $rc" test "$rc" -eq 7
expect "stdout and stderr arrive separately" "" \
  sh -c 'test "$(cat "$1")" = to-stdout && grep -q "^to-stderr\$" "$2"' _ "$tmp/x.out" "$tmp/x.err"

echo "smoke: booting VM for the timeout check"
rc=0
t0=${EPOCHREALTIME/[.,]/}
"$RUN" --timeout 15 sleep 600 >/dev/null 2>"$tmp/t.err" || rc=$?
dt=$(( ${EPOCHREALTIME/[.,]/} - t0 ))
expect "hung command is killed by --timeout with 124" "got $rc after $(secs $dt) s" \
  test "$rc" -eq 124 -a "$dt" -lt 30000000

echo "smoke: booting VM for the watchdog check"
rc=0
t0=${EPOCHREALTIME/[.,]/}
SOFTROCE_VM_WATCHDOG=3 "$RUN" --timeout 150 tail -f /dev/null >/dev/null 2>"$tmp/w.err" || rc=$?
dt=$(( ${EPOCHREALTIME/[.,]/} - t0 ))
expect "the guest's watchdog stops a hung command with 124, before the host's timeout" \
  "got $rc after $(secs $dt) s" test "$rc" -eq 124 -a "$dt" -lt 150000000
sed 's/^/  watchdog run: /' "$tmp/w.err"
expect "it says so, and where the hung process was in the kernel" "" \
  sh -c 'grep -q "^vm: timed out: the guest.s watchdog stopped the command after 3 s" "$1" &&
         grep -q "^== pid [0-9]* (tail) .*tail -f /dev/null" "$1" && grep -q "^     k " "$1"' _ "$tmp/w.err"
if command -v gdb >/dev/null; then
  expect "and in user space (gdb)" "" grep -q "^     u #0 " "$tmp/w.err"
else
  echo "smoke: NOTE: gdb is not installed here: the watchdog's user stacks are not checked"
fi

echo "smoke: $passed passed, $failed failed; ${boot_line#vm: }; total $(secs $(( ${EPOCHREALTIME/[.,]/} - T_BEGIN ))) s"
[[ $failed -eq 0 ]]
