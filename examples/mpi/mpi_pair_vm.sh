#!/bin/bash
# In VM 1 of test/vm/run_pair.sh: mpi_pingpong with one rank per VM, Open
# MPI's UCX pml, UCX restricted to RC verbs on rxe0 (UCX_TLS=rc,self), so the
# ranks talk only over RoCE across the virtual link. mpirun starts the orted
# of VM 2 through the pair's rsh (vm_rsh.py as plm_rsh_agent). Three runs:
#   rdmalloc   preloaded into both ranks, plain heap's access widened, UCX's
#              registration cache and memory hooks off (as mpi_served_vm.sh):
#              each rank's UCX registrations served by rdmalloc in its own VM
#   control    no rdmalloc, UCX defaults: the same job passes without it
#   corrupt    no rdmalloc, mpi_pingpong --corrupt: must FAIL (bytes checked)
#
#   mpi_pair_vm.sh MPI_PINGPONG LIBRDMALLOC_SO [ITERS]
set -u
prog=$(realpath "$1")
lib=$(realpath "$2")
iters=${3:-4}
rsh=$SOFTROCE_PAIR_RSH
peer=$SOFTROCE_PAIR_PEER
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }

# The same short local directory in both guests (each its own /tmp): Open
# MPI's session directory (sockets), HOME, and each rank's rdmalloc report.
work=/tmp/rdmalloc-mpi-pair
mkdir -p "$work" && python3 "$rsh" "$peer" "mkdir -p $work" || { echo "FAIL: cannot make $work"; exit 1; }
export TMPDIR="$work" HOME="$work"

# UCX 1.13's UD transport (UCX adds it for wire-up) checks the destination
# GID of each packet it receives; it drops every packet rxe delivers over
# IPv4 RoCEv2, the GID UCX picks on a NIC with an IPv4 address (rxe's counters
# show them received; the wire-up then times out). Its check is off:
# nothing but the two guests shares the link.
mpirun_pair() {  # NAME MPIRUN-ARGS... -- PROGRAM-ARGS...
  local name=$1 start=$SECONDS rc
  shift
  local args=()
  while [ "$1" != -- ]; do args+=("$1"); shift; done
  shift
  mpirun -np 2 --host "$SOFTROCE_PAIR_SELF:1,$peer:1" --mca plm_rsh_agent "$rsh" \
    --mca orte_tmpdir_base "$work" --allow-run-as-root --bind-to none \
    --mca pml ucx --mca btl self -x UCX_NET_DEVICES=rxe0:1 -x UCX_TLS=rc,self \
    -x UCX_UD_VERBS_ETH_DGID_CHECK=n "${args[@]}" \
    "$prog" --iters "$iters" "$@" >"$work/$name.out" 2>"$work/$name.err"
  rc=$?
  echo "--- $name: mpirun exit $rc in $((SECONDS - start)) s"
  grep -v ' UCX  INFO ' "$work/$name.out"
  grep -v ' UCX  INFO ' "$work/$name.err" | sed 's/^/  stderr: /' | head -n 30
  return $rc
}
passed() { grep -q '^mpi_pingpong: PASS (0 wrong bytes over 2 ranks)$' "$work/$1.out"; }

rm -f "$work/report.json"
python3 "$rsh" "$peer" "rm -f $work/report.json"
mpirun_pair rdmalloc -x UCX_LOG_LEVEL=info \
  -x UCX_IB_REG_METHODS=direct -x UCX_RCACHE_ENABLE=n -x UCX_MEM_MALLOC_HOOKS=no \
  -x UCX_MEM_MMAP_HOOK_MODE=none -x LD_PRELOAD="$lib" -x RDMALLOC_BACKEND=verbs \
  -x RDMALLOC_ACCESS=local_write,remote_read,remote_write,remote_atomic \
  -x RDMALLOC_STATS=json -x RDMALLOC_STATS_FILE="$work/report.json" -- ||
  fail "rdmalloc: mpirun failed"
passed rdmalloc || fail "rdmalloc: wrong bytes or no result"
# One rank in each VM, each with its endpoint to the other over rc_verbs on rxe0 alone.
for host in rdmalloc-vm1 rdmalloc-vm2; do
  grep -hE "^\[[0-9.]+\] +\[$host:[0-9]+ +:[0-9a-f]+\] .*ep_cfg\[[0-9]+\]: tag\(rc_verbs/rxe0:1\)$" \
    "$work/rdmalloc.out" "$work/rdmalloc.err" | grep -q . ||
    fail "rdmalloc: no rank in $host with a UCX endpoint over rc_verbs/rxe0:1 alone"
done
# rdmalloc in each rank: its lookups hit, and its report (in its own VM) shows
# UCX's ibv_reg_mr calls served.
[ "$(grep -cE '^rank [01]: pid [0-9]+ rdmalloc present backend=verbs lookups=([1-9][0-9]*) hits=\1 bad_bytes=0$' \
  "$work/rdmalloc.out")" -eq 2 ] || fail "rdmalloc: not present with every lookup hit in both ranks"
python3 "$rsh" "$peer" "cat $work/report.json" >"$work/report-vm2.json"
for vm in vm1 vm2; do
  f=$work/report.json
  [ $vm = vm2 ] && f=$work/report-vm2.json
  python3 - "$vm" "$f" <<'PY' || fail "rdmalloc: $vm's rank: registrations not served"
import json, os, sys
vm, path = sys.argv[1], sys.argv[2]
reps = [json.loads(l) for l in open(path) if l.startswith("{")] if os.path.exists(path) else []
if not reps:
    print(f"  {vm}: no rdmalloc report")
ok = len(reps) == 1 and reps[0]["mrs_served"] > 0 and reps[0]["reg_failures"] == 0
for r in reps:
    print(f"  {vm}: pid {r['pid']}: UCX's ibv_reg_mr {r['mrs_served']} served, "
          f"{r['mrs_forwarded']} forwarded; rdmalloc's own registrations {r['reg_calls']}, "
          f"{r['reg_failures']} failed")
sys.exit(0 if ok else 1)
PY
done

mpirun_pair control -- --no-lookup || fail "control: mpirun failed"
passed control || fail "control: wrong bytes or no result"

if mpirun_pair corrupt -- --no-lookup --corrupt || passed corrupt ||
   ! grep -q '^mpi_pingpong: FAIL' "$work/corrupt.out"; then
  fail "corrupt: a corrupted byte across the VMs went unnoticed"
else
  echo "corrupt: the corrupted reply failed the job, as it must"
fi

if [ "$failures" -ne 0 ]; then
  echo "mpi_pair_vm: $failures check(s) failed"
  exit 1
fi
echo "mpi_pair_vm: all checks passed"
