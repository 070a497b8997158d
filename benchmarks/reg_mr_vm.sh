#!/bin/bash
# Inside the soft-RoCE VM: reg_mr_benchmark four ways, one line per size each,
# prefixed with the way: kernel (no rdmalloc), forwarded (rdmalloc, default
# local-only heap: remote requests go to libibverbs), served (rdmalloc with
# RDMALLOC_ACCESS widened), served_one (served, one message per window: the
# control for the sizes whose window holds one message).
#   reg_mr_vm.sh REG_MR_BENCHMARK LIBRDMALLOC MIN_TIME
set -euo pipefail
bench=$1
lib=$2
min_time=$3
"$bench" --min-time="$min_time" | sed 's/^/way=kernel /'
env LD_PRELOAD="$lib" RDMALLOC_BACKEND=verbs "$bench" --min-time="$min_time" | sed 's/^/way=forwarded /'
env LD_PRELOAD="$lib" RDMALLOC_BACKEND=verbs RDMALLOC_ACCESS=local_write,remote_read,remote_write \
  "$bench" --min-time="$min_time" | sed 's/^/way=served /'
env LD_PRELOAD="$lib" RDMALLOC_BACKEND=verbs RDMALLOC_ACCESS=local_write,remote_read,remote_write \
  "$bench" --min-time="$min_time" --window=1 | sed 's/^/way=served_one /'
