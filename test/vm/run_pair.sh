#!/usr/bin/env bash
# Runs a command in the first of two throw-away soft-RoCE VMs (run.sh) joined by a virtual
# Ethernet link, with the second VM at its service: how programs run across two nodes.
#
#   test/vm/run_pair.sh [--timeout SECS] [--] CMD [ARGS...]
#
# The link is a QEMU socket netdev over 127.0.0.1:PORT (a free port; VM 2's QEMU listens,
# VM 1's connects) between a virtio-net NIC in each guest, and rxe0 sits on that NIC:
#
#   VM 1  host name rdmalloc-vm1  10.77.0.1/24  runs CMD (in the caller's cwd, as run.sh)
#   VM 2  host name rdmalloc-vm2  10.77.0.2/24  runs `vm_rsh.py serve` on 10.77.0.2:7070
#
# CMD starts processes in VM 2 with `$SOFTROCE_PAIR_RSH $SOFTROCE_PAIR_PEER COMMAND...`
# (vm_rsh.py: bash -c COMMAND there, in the same cwd and environment, its output and exit
# status back; also Open MPI's plm_rsh_agent). SOFTROCE_PAIR_SELF is VM 1's address. When
# CMD ends, VM 1 stops VM 2's server and both guests power off.
#
# Each guest gets one vCPU (SOFTROCE_VM_SMP, default 1 here): two TCG guests share the
# host's cores. Other SOFTROCE_VM_* settings apply to both.
#
# Exit code: CMD's; else 1 if VM 2 failed (its server or its guest); 124 if a timeout
# fired; 125 ("vm: cannot start: ...") if either VM could not be booted or set up.
set -uo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
RUN=$HERE/run.sh
RSH=$HERE/vm_rsh.py
TIMEOUT=300
usage() { sed -n '5p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2; exit 2; }
while [[ $# -gt 0 ]]; do
  case $1 in
    --timeout) [[ $# -ge 2 && $2 =~ ^[0-9]+$ && $2 -gt 0 ]] || usage; TIMEOUT=$2; shift 2 ;;
    --timeout=*) TIMEOUT=${1#*=}; [[ $TIMEOUT =~ ^[0-9]+$ && $TIMEOUT -gt 0 ]] || usage; shift ;;
    -h|--help) usage ;;
    --) shift; break ;;
    -*) usage ;;
    *) break ;;
  esac
done
[[ $# -gt 0 ]] || usage

export SOFTROCE_VM_SMP=${SOFTROCE_VM_SMP:-1}
export SOFTROCE_PAIR_RSH=$RSH SOFTROCE_PAIR_SELF=10.77.0.1 SOFTROCE_PAIR_PEER=10.77.0.2

# Build the shared kernel/initramfs cache once, before two runs race to build it.
out=$(bash "$RUN" --prepare 2>&1) || { rc=$?; echo "$out" >&2; exit "$rc"; }

port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])') ||
  { echo "vm: cannot start: no free TCP port on 127.0.0.1"; exit 125; }

PID1= PID2= log2=
cleanup() {
  local p
  for p in $PID1 $PID2; do kill -TERM "$p" 2>/dev/null; done
  wait 2>/dev/null
  [[ -z $log2 ]] || rm -f "$log2"
}
trap cleanup EXIT
trap 'exit 143' TERM INT HUP

# VM 2 first: its QEMU must listen before VM 1's connects. Its output (the server's few
# lines; remote commands' output goes to their clients) is printed at the end, prefixed,
# and its "vm: cannot start" reason passed on unprefixed, for vm_test.sh.
log2=$(mktemp "${TMPDIR:-/tmp}/run_pair.vm2.XXXXXX")
# VM 1's watchdog also prints VM 2's processes through the server; VM 2's own fires
# after VM 1's has tried that (up to 65 s), for when the server or the link cannot answer.
watchdog1=$(bash "$RUN" --timeout "$TIMEOUT" --print-watchdog) || exit 2
watchdog2=0
((watchdog1 > 0)) && watchdog2=$((watchdog1 + 90))
SOFTROCE_VM_WATCHDOG=$watchdog2 SOFTROCE_VM_NET=listen:$port SOFTROCE_VM_IP=10.77.0.2/24 SOFTROCE_VM_HOSTNAME=rdmalloc-vm2 \
  bash "$RUN" --timeout $((TIMEOUT + 120)) -- python3 "$RSH" serve 10.77.0.2 >"$log2" 2>&1 &
PID2=$!
vm2_done() {  # VM 2 has ended with exit code $1
  sed 's/^/[vm2] /' "$log2" >&2
  if [[ $1 -eq 125 ]]; then
    grep -m1 '^vm: cannot start' "$log2" | sed 's/start:/start: vm2:/' | grep . >&2 ||
      echo "vm: cannot start: vm2 exited 125" >&2
    exit 125
  fi
}
listening=0
for ((i = 0; i < 600; i++)); do
  if ss -Hltn "sport = :$port" | grep -q .; then listening=1; break; fi
  kill -0 "$PID2" 2>/dev/null || break
  sleep 0.1
done
if [[ $listening -eq 0 ]]; then
  kill -TERM "$PID2" 2>/dev/null   # if it still runs without listening
  wait "$PID2"; rc=$?; PID2=
  vm2_done "$rc"
  echo "vm: cannot start: vm2's QEMU did not listen on 127.0.0.1:$port (vm2 exit $rc)" >&2
  exit 125
fi

# VM 1: CMD, then stop VM 2's server whatever CMD's result.
SOFTROCE_VM_WATCHDOG=$watchdog1 SOFTROCE_VM_STACKS_PEER=$SOFTROCE_PAIR_PEER \
  SOFTROCE_VM_NET=connect:$port SOFTROCE_VM_IP=10.77.0.1/24 SOFTROCE_VM_HOSTNAME=rdmalloc-vm1 \
  bash "$RUN" --timeout "$TIMEOUT" -- bash -c \
  '"$@"; rc=$?; timeout 20 python3 "$SOFTROCE_PAIR_RSH" --stop "$SOFTROCE_PAIR_PEER" || echo "vm1: could not stop vm2 server" >&2; exit $rc' \
  run_pair "$@" &
PID1=$!

# Whichever ends first. VM 2 ends cleanly (0) only when VM 1 stopped its server; ending
# otherwise while VM 1 runs fails the run (VM 1's CMD could not finish).
wait -n "$PID1" "$PID2"
if ! kill -0 "$PID2" 2>/dev/null; then
  wait "$PID2"; rc2=$?; PID2=
  if [[ $rc2 -ne 0 ]] && kill -0 "$PID1" 2>/dev/null; then
    vm2_done "$rc2"
    echo "run_pair: vm2 ended (exit $rc2) while vm1 still ran; stopping vm1" >&2
    kill -TERM "$PID1"; wait "$PID1"; PID1=
    exit 1
  fi
fi
wait "$PID1"; rc1=$?; PID1=
if [[ -n $PID2 ]]; then
  # Stopped by VM 1; a guest powers off within seconds.
  for ((i = 0; i < 300; i++)); do kill -0 "$PID2" 2>/dev/null || break; sleep 0.1; done
  kill -0 "$PID2" 2>/dev/null && { echo "run_pair: vm2 did not stop; killing it" >&2; kill -TERM "$PID2"; }
  wait "$PID2"; rc2=$?; PID2=
fi
[[ $rc1 -eq 125 ]] && exit 125
vm2_done "$rc2"
[[ $rc1 -ne 0 ]] && exit "$rc1"
[[ $rc2 -eq 0 ]] || { echo "run_pair: vm2 exited $rc2" >&2; exit 1; }
exit 0
