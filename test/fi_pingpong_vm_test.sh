#!/bin/bash
# Inside the soft-RoCE VM: libfabric's own fi_pingpong (Debian's libfabric-bin,
# unmodified) on the verbs provider over rxe0, server and client in two
# processes, with data checks (-c), three ways:
#   kernel     no rdmalloc
#   forwarded  rdmalloc preloaded, local-only plain heap: the provider's MR
#              asks for remote rights, so it goes to libibverbs
#   served     rdmalloc with RDMALLOC_ACCESS widened: the MR of fi_pingpong's
#              heap buffer is served from the heap's registration
# Kernel registrations are counted by a kprobe (test/vm/kernel_regs.sh) and
# must equal what rdmalloc says reached the kernel (its own region
# registrations plus what it forwarded).
#   fi_pingpong_vm_test.sh LIBRDMALLOC_SO
set -u
lib=$(realpath "$1")
source "$(dirname "$0")/vm/kernel_regs.sh"
kernel_regs_start || exit 1
pingpong=$(command -v fi_pingpong) ||
  { echo "FAIL: fi_pingpong not installed (libfabric-bin; tools/setup.sh installs it)"; exit 1; }
work=$(mktemp -d /tmp/fi_pingpong.XXXXXX) || exit 1
trap 'rm -rf "$work"' EXIT
# rdma_cm resolves the server by IP: rxe0's netdev needs an address.
addr=10.77.0.1
ip addr add "$addr/24" dev rxedummy0 || { echo "FAIL: cannot address rxe0's netdev"; exit 1; }
failed=0
fail() { echo "FAIL: $*"; failed=$((failed + 1)); }

run() {
  local way=$1 before server rc_s rc_c kernel
  shift
  rm -f "$work/$way.json"
  before=$(kernel_regs)
  # msg endpoints (RC over rdma_cm); sizes 64 B .. 8 MiB, 5 iterations each.
  # Each side under a timeout: a client that never connects leaves the server
  # waiting for good.
  timeout 300 env "$@" "$pingpong" -p verbs -e msg -d rxe0 -I 5 -S all -c \
    >"$work/$way.server" 2>&1 &
  server=$!
  # The client connects once the server listens on its control port (47592);
  # under a loaded emulator that can take seconds.
  for ((i = 0; i < 600; i++)); do
    ss -ltnH 'sport = :47592' 2>/dev/null | grep -q . && break
    sleep 0.1
  done
  timeout 300 env "$@" "$pingpong" -p verbs -e msg -d rxe0 -I 5 -S all -c "$addr" \
    >"$work/$way.client" 2>&1
  rc_c=$?
  wait "$server"
  rc_s=$?
  kernel=$(( $(kernel_regs) - before ))
  echo "--- $way: server exit $rc_s, client exit $rc_c, kernel registrations $kernel"
  tail -n 3 "$work/$way.client" | sed 's/^/  /'
  [ $rc_s -eq 0 ] && [ $rc_c -eq 0 ] || { fail "$way: fi_pingpong failed"; cat "$work/$way.client"; }
  [ "$way" = kernel ] && { [ "$kernel" -ge 2 ] || fail "kernel: $kernel registrations, expected one per process at least"; return; }
  python3 - "$work/$way.json" "$way" "$kernel" <<'PY' || failed=$((failed + 1))
import json, sys
path, way, kernel = sys.argv[1], sys.argv[2], int(sys.argv[3])
reps = [json.loads(l) for l in open(path) if l.startswith("{")]
served = sum(r["mrs_served"] for r in reps)
forwarded = sum(r["mrs_forwarded"] for r in reps)
own = sum(r["reg_calls"] for r in reps)
print(f"  rdmalloc: {len(reps)} processes, {served} served, {forwarded} forwarded, {own} own registrations")
bad = []
if len(reps) != 2:
    bad.append(f"{len(reps)} reports, expected 2")
if kernel != own + forwarded:
    bad.append(f"kernel counted {kernel} registrations, rdmalloc accounts for {own} + {forwarded}")
if way == "served" and any(r["mrs_served"] == 0 for r in reps):
    bad.append("a process had no MR served")
if way == "forwarded" and (served != 0 or forwarded < 2):
    bad.append("remote rights on the local-only heap must be forwarded")
for b in bad:
    print(f"FAIL: {way}: {b}")
sys.exit(1 if bad else 0)
PY
}

stats=(RDMALLOC_BACKEND=verbs RDMALLOC_STATS=json)
run kernel
run forwarded LD_PRELOAD="$lib" "${stats[@]}" RDMALLOC_STATS_FILE="$work/forwarded.json"
run served LD_PRELOAD="$lib" "${stats[@]}" RDMALLOC_STATS_FILE="$work/served.json" \
  RDMALLOC_ACCESS=local_write,remote_read,remote_write,remote_atomic  # the provider asks for all
echo "fi_pingpong_vm_test: $failed check(s) failed"
[ "$failed" -eq 0 ]
