#!/bin/bash
# mpi_pingpong under `mpirun -np 2` on this machine, with rdmalloc preloaded
# into both ranks (over shared memory, then over TCP), without rdmalloc (the
# control), and with one corrupted byte (the negative control). Checks every
# run's result and, under rdmalloc, each rank's lookups and exit report.
#
#   mpi_pingpong_test.sh MPI_PINGPONG LIBRDMALLOC_SO CHECK_RANKS_PY
set -u
prog="$(cd "$(dirname "$1")" && pwd)/$(basename "$1")"
lib="$(cd "$(dirname "$2")" && pwd)/$(basename "$2")"
checker="$3"
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }

command -v mpirun >/dev/null || { echo "FAIL: mpirun not found (tools/setup.sh installs openmpi-bin)"; exit 1; }

# Open MPI puts its session directory and the PMIx rendezvous sockets under
# TMPDIR; Bazel's TEST_TMPDIR is too deep for a Unix socket path (108 bytes),
# so use a short directory of our own. HOME: Open MPI reads per-user settings
# from it ($HOME/.openmpi); keep it inside the test.
work=$(mktemp -d /tmp/rdmalloc-mpi.XXXXXX) || { echo "FAIL: mktemp"; exit 1; }
trap 'rm -rf "$work"' EXIT
export TMPDIR="$work" HOME="$work"

# As root (CI runs as root) mpirun needs --allow-run-as-root; --oversubscribe
# because the machine may have fewer free slots than ranks. pml ob1 keeps the
# transport to the btls named per run (UCX stays out on the host); TCP and the
# out-of-band channel on loopback only. A hung job fails after 120 s (exit 124).
mpi=(timeout -k 5 120 mpirun -np 2 --allow-run-as-root --oversubscribe --bind-to none
     --mca pml ob1 --mca btl_tcp_if_include lo --mca oob_tcp_if_include lo)

# run NAME BTLS WITH_RDMALLOC(yes|no) [program args...]: output in $work/NAME.{out,err,json}
run() {
  local name=$1 btl=$2 with=$3
  shift 3
  local env=(-x RDMALLOC_STATS=json -x RDMALLOC_STATS_FILE="$work/$name.json")
  [ "$with" == yes ] && env+=(-x LD_PRELOAD="$lib")
  "${mpi[@]}" --mca btl "$btl" "${env[@]}" "$prog" "$@" >"$work/$name.out" 2>"$work/$name.err"
  local rc=$?
  echo "--- $name (btl $btl, rdmalloc $with): exit $rc"
  cat "$work/$name.out"
  [ -s "$work/$name.err" ] && sed 's/^/  stderr: /' "$work/$name.err" | head -n 30
  return $rc
}

# Every rank under rdmalloc: all lookups hit, and its exit report (matched by
# pid) shows live registered regions and the same number of lookups.
check_rdmalloc_ranks() {  # NAME
  python3 "$checker" "$work/$1.out" "$work/$1.json" 2 || fail "$1: rdmalloc was not active in every rank"
}

passed() { grep -q '^mpi_pingpong: PASS (0 wrong bytes over 2 ranks)$' "$work/$1.out"; }

# 1. rdmalloc, shared memory (vader).
run shm_rdmalloc self,vader yes || fail "shm_rdmalloc: mpirun exited non-zero"
passed shm_rdmalloc || fail "shm_rdmalloc: results wrong"
check_rdmalloc_ranks shm_rdmalloc

# 2. rdmalloc, TCP on loopback.
run tcp_rdmalloc self,tcp yes || fail "tcp_rdmalloc: mpirun exited non-zero"
passed tcp_rdmalloc || fail "tcp_rdmalloc: results wrong"
check_rdmalloc_ranks tcp_rdmalloc

# 3. Control: the same program without rdmalloc sees no rdmalloc and writes no report.
run shm_plain self,vader no || fail "shm_plain: mpirun exited non-zero"
passed shm_plain || fail "shm_plain: results wrong"
[ "$(grep -c '^rank [01]: pid [0-9]* rdmalloc absent bad_bytes=0$' "$work/shm_plain.out")" == 2 ] ||
  fail "shm_plain: ranks did not both report rdmalloc absent"
[ ! -e "$work/shm_plain.json" ] || fail "shm_plain: a report was written without rdmalloc"

# 4. Negative control: one flipped byte under rdmalloc must be caught.
if run corrupt_rdmalloc self,vader yes --corrupt --max-size 65536; then
  fail "corrupt_rdmalloc: a corrupted byte went unnoticed"
fi
grep -q '^mpi_pingpong: FAIL (1 wrong bytes over 2 ranks)$' "$work/corrupt_rdmalloc.out" ||
  fail "corrupt_rdmalloc: expected exactly 1 wrong byte"

if [ "$failures" -ne 0 ]; then
  echo "$failures check(s) failed"
  exit 1
fi
echo "all MPI checks passed"
