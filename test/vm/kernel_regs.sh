# Sourced by scripts that run inside the soft-RoCE VM (test/vm/run.sh): counts
# memory registrations in the kernel itself, independent of rdmalloc's own
# counters, with a kprobe on rdma_rxe's rxe_reg_user_mr (every user ibv_reg_mr
# on rxe ends there; a re-registration does not).
#
#   kernel_regs_start || exit 1   # once, as root: mounts tracefs, adds the probe
#   n=$(kernel_regs)              # registrations so far, all processes
kernel_regs_tracing=/sys/kernel/tracing

kernel_regs_start() {
  local t=$kernel_regs_tracing
  mountpoint -q "$t" || mount -t tracefs nodev "$t" ||
    { echo "FAIL: cannot mount tracefs: kernel registrations cannot be counted"; return 1; }
  echo 'p:rdmalloc_test_reg_mr rxe_reg_user_mr' >>"$t/kprobe_events" &&
    echo 1 >"$t/events/kprobes/rdmalloc_test_reg_mr/enable" ||
    { echo "FAIL: no kprobe on rxe_reg_user_mr: kernel registrations cannot be counted"; return 1; }
}

kernel_regs() { awk '$1 == "rdmalloc_test_reg_mr" { print $2 }' "$kernel_regs_tracing/kprobe_profile"; }
