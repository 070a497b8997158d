#!/bin/bash
# Runs inside the soft-RoCE VM (test/vm/run.sh): mpi_pingpong under
# `mpirun -np 2` with Open MPI's UCX pml, UCX restricted to RC verbs on rxe0,
# rdmalloc preloaded into both ranks (its verbs backend registers on rxe0 too).
# Checks the results, that UCX's endpoints to the peer really run over
# rc_verbs/rxe0:1, and that rdmalloc was active in each rank.
#
#   mpi_ucx_vm_check.sh MPI_PINGPONG LIBRDMALLOC_SO CHECK_RANKS_PY
set -u
prog="$(cd "$(dirname "$1")" && pwd)/$(basename "$1")"
lib="$(cd "$(dirname "$2")" && pwd)/$(basename "$2")"
checker="$3"
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }

# The guest has no host name ("(none)"), which Open MPI rejects as a node name.
[ "$(hostname)" == "(none)" ] && hostname rdmalloc-vm
# A short TMPDIR for Open MPI's session directory and sockets (see
# mpi_pingpong_test.sh); the guest's /tmp is its own tmpfs overlay.
work=$(mktemp -d /tmp/rdmalloc-mpi.XXXXXX) || { echo "FAIL: mktemp"; exit 1; }
trap 'rm -rf "$work"' EXIT
export TMPDIR="$work" HOME="$work"

# UCX_TLS=rc,self: RC verbs to the peer (UCX adds UD for wire-up), no shared
# memory or TCP, so the ranks can only talk through rxe0. UCX_LOG_LEVEL=info
# makes UCX print each endpoint's transports. btl self only: the openib btl
# stays away from rxe0 (Open MPI's UCX pml does the messaging).
# --iters 4: 4 iterations per size (TCG emulation makes rxe slow); sizes
# still run 8 B .. 4 MiB.
mpirun -np 2 --allow-run-as-root --oversubscribe --bind-to none \
  --mca pml ucx --mca btl self \
  -x UCX_NET_DEVICES=rxe0:1 -x UCX_TLS=rc,self -x UCX_LOG_LEVEL=info \
  -x LD_PRELOAD="$lib" -x RDMALLOC_STATS=json -x RDMALLOC_STATS_FILE="$work/report.json" \
  "$prog" --iters 4 >"$work/out" 2>"$work/err"
rc=$?
echo "--- mpirun (pml ucx, UCX_TLS=rc,self on rxe0:1, rdmalloc preloaded): exit $rc"
grep -v ' UCX  INFO ' "$work/out"
grep -v ' UCX  INFO ' "$work/err" | sed 's/^/  stderr: /' | head -n 40
grep -h 'ep_cfg' "$work/out" "$work/err"
[ $rc -eq 0 ] || fail "mpirun exited $rc"
grep -q '^mpi_pingpong: PASS (0 wrong bytes over 2 ranks)$' "$work/out" || fail "results wrong"

# Each rank's endpoint to its peer: tag matching over rc_verbs on rxe0 alone.
for pid in $(sed -n 's/^rank [01]: pid \([0-9]*\) .*/\1/p' "$work/out"); do
  grep -qE "\[[^]:]*:$pid +:[0-9a-f]+\] .*ep_cfg\[[0-9]+\]: tag\(rc_verbs/rxe0:1\)$" "$work/out" "$work/err" ||
    fail "pid $pid: no UCX endpoint over rc_verbs/rxe0:1 alone"
done
python3 "$checker" "$work/out" "$work/report.json" 2 verbs || fail "rdmalloc was not active in every rank"

# Again with UCX's own malloc and mmap hooks off: UCX's registration cache then
# hears of released memory only from rdmalloc (RDMALLOC_NOTIFY=ucx, set up in
# each rank before main; docs/NOTIFICATIONS.md).
mpirun -np 2 --allow-run-as-root --oversubscribe --bind-to none \
  --mca pml ucx --mca btl self \
  -x UCX_NET_DEVICES=rxe0:1 -x UCX_TLS=rc,self \
  -x UCX_MEM_MALLOC_HOOKS=no -x UCX_MEM_MMAP_HOOK_MODE=none -x RDMALLOC_NOTIFY=ucx \
  -x LD_PRELOAD="$lib" -x RDMALLOC_STATS=json -x RDMALLOC_STATS_FILE="$work/report2.json" \
  "$prog" --iters 4 >"$work/out2" 2>"$work/err2"
rc=$?
echo "--- mpirun (pml ucx, UCX's hooks off, RDMALLOC_NOTIFY=ucx): exit $rc"
cat "$work/out2"
sed 's/^/  stderr: /' "$work/err2" | head -n 40
[ $rc -eq 0 ] || fail "mpirun with RDMALLOC_NOTIFY=ucx exited $rc"
grep -q '^mpi_pingpong: PASS (0 wrong bytes over 2 ranks)$' "$work/out2" || fail "results wrong with UCX's hooks off"
python3 "$checker" "$work/out2" "$work/report2.json" 2 verbs || fail "rdmalloc not active with RDMALLOC_NOTIFY=ucx"
[ "$(grep -c '"observers":1,' "$work/report2.json")" -eq 2 ] ||
  fail "not every rank had UCX as a release observer: $(cat "$work/report2.json")"

if [ "$failures" -ne 0 ]; then
  echo "$failures check(s) failed"
  exit 1
fi
echo "all MPI-over-UCX checks passed"
