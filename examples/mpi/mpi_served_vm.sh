#!/bin/bash
# Inside the soft-RoCE VM (test/vm/run.sh): the plain MPI program
# (mpi_pingpong --no-lookup, fresh buffers per message) over Open MPI's UCX
# pml on rxe0, four ways, side by side:
#   ucx-cache      UCX defaults (its registration cache and memory hooks), no rdmalloc
#   direct         UCX's cache and hooks off, no rdmalloc: a kernel registration per use
#   rdmalloc       UCX's cache and hooks off, rdmalloc preloaded with the plain heap's
#                  access widened: UCX's ibv_reg_mr calls are served (docs/INTERPOSE.md)
#   interpose-off  the same with RDMALLOC_INTERPOSE=0: the negative control of the count
# UCX 1.13 has no UCX_MEM_EVENTS; its cache and hooks are UCX_IB_REG_METHODS,
# UCX_RCACHE_ENABLE, UCX_MEM_MALLOC_HOOKS and UCX_MEM_MMAP_HOOK_MODE.
#
# Kernel registrations are counted by the kernel, not by rdmalloc
# (test/vm/kernel_regs.sh: a kprobe), before and after each run.
# check_served.py then checks the counts against each rank's rdmalloc report.
#
#   mpi_served_vm.sh MPI_PINGPONG LIBRDMALLOC_SO CHECK_SERVED_PY [ITERS]
#
# Prints "way=W size=N us=T" per message size and "way=W kernel_regs=K" per
# run (what benchmarks/run.py --only-mpi tabulates); exit 0 only if every
# check passed.
set -u
prog=$(realpath "$1")
lib=$(realpath "$2")
checker=$3
iters=${4:-4}

[ "$(hostname)" == "(none)" ] && hostname rdmalloc-vm
work=$(mktemp -d /tmp/rdmalloc-mpi.XXXXXX) || { echo "FAIL: mktemp"; exit 1; }
trap 'rm -rf "$work"' EXIT
export TMPDIR="$work" HOME="$work"   # Open MPI's session dir: short paths

# shellcheck source=../../test/vm/kernel_regs.sh
source "$(dirname "$0")/../../test/vm/kernel_regs.sh"
kernel_regs_start || exit 1

no_cache=(-x UCX_IB_REG_METHODS=direct -x UCX_RCACHE_ENABLE=n
          -x UCX_MEM_MALLOC_HOOKS=no -x UCX_MEM_MMAP_HOOK_MODE=none)
widened=local_write,remote_read,remote_write,remote_atomic   # UCX asks for all four

run() {
  local way=$1 before after rc
  shift
  before=$(kernel_regs)
  # UCX_TLS=rc,self: the ranks talk only over RC verbs on rxe0 (as mpi_ucx_vm_check.sh).
  mpirun -np 2 --allow-run-as-root --oversubscribe --bind-to none \
    --mca pml ucx --mca btl self -x UCX_NET_DEVICES=rxe0:1 -x UCX_TLS=rc,self \
    "$@" "$prog" --iters "$iters" --no-lookup >"$work/$way.out" 2>"$work/$way.err"
  rc=$?
  after=$(kernel_regs)
  echo "--- $way: mpirun exit $rc"
  sed 's/^/  stderr: /' "$work/$way.err" | head -n 20
  grep -q '^mpi_pingpong: PASS (0 wrong bytes over 2 ranks)$' "$work/$way.out" || rc=1
  awk -v w="$way" 'NF == 3 && $1 ~ /^[0-9]+$/ { print "way=" w " size=" $1 " us=" $3 }' "$work/$way.out"
  echo "way=$way kernel_regs=$((after - before)) pass=$([ $rc -eq 0 ] && echo 1 || echo 0)"
}

run ucx-cache | tee -a "$work/summary"
run direct "${no_cache[@]}" | tee -a "$work/summary"
run rdmalloc "${no_cache[@]}" -x LD_PRELOAD="$lib" -x RDMALLOC_BACKEND=verbs \
  -x RDMALLOC_ACCESS=$widened -x RDMALLOC_STATS=json -x RDMALLOC_STATS_FILE="$work/rdmalloc.json" |
  tee -a "$work/summary"
run interpose-off "${no_cache[@]}" -x LD_PRELOAD="$lib" -x RDMALLOC_BACKEND=verbs \
  -x RDMALLOC_ACCESS=$widened -x RDMALLOC_INTERPOSE=0 \
  -x RDMALLOC_STATS=json -x RDMALLOC_STATS_FILE="$work/interpose-off.json" | tee -a "$work/summary"
python3 "$checker" "$work"
