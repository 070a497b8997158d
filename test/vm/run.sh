#!/usr/bin/env bash
# Runs a command as root inside a throw-away QEMU VM that has a soft-RoCE device (rxe0).
#
#   test/vm/run.sh [--timeout SECS] [--] CMD [ARGS...]
#   test/vm/run.sh --prepare        # only build the cached kernel + initramfs
#   test/vm/run.sh [--timeout SECS] --print-watchdog   # SOFTROCE_VM_WATCHDOG's value
#
# Why a VM: the host kernel may have no InfiniBand support at all, while Debian's own
# kernel ships rdma_rxe. The guest boots that kernel, sees the host's / read-only over
# 9p (with a tmpfs overlay so writes succeed but are discarded), chroots into it and runs
# CMD with `ulimit -l unlimited` in the caller's working directory. Host binaries and the
# host's libibverbs/librxe therefore run unchanged at the same paths.
#
# Exit code: CMD's exit code; 124 if it timed out (the guest's watchdog stopped it after
# printing where each process was, or the host-side timeout killed the guest); 125 ("vm:
# cannot start: ...") if the VM could not be booted or the RDMA device could not be set up.
#
# Environment (all optional):
#   SOFTROCE_VM_DIR      cache + run directory (default /var/tmp/rdmalloc-vm)
#   SOFTROCE_VM_ACCEL    tcg | kvm (default: tcg if kvm_pvm is loaded or /dev/kvm unusable)
#   SOFTROCE_VM_MEM      guest memory (default 2G);  SOFTROCE_VM_SMP  vCPUs (default nproc, max 4)
#   SOFTROCE_VM_KVER     kernel version to boot (default: newest in /boot with rdma_rxe)
#   SOFTROCE_VM_RW       extra colon-separated host dirs the guest may write to
#   SOFTROCE_VM_VERBOSE  1: copy the guest console to stderr while it runs
#   SOFTROCE_VM_APPEND   extra kernel command line (e.g. "loglevel=7" to debug a boot)
#   SOFTROCE_VM_KEEP     1: keep the per-run results dir (its path is printed)
#   SOFTROCE_VM_NET      listen:PORT | connect:PORT: give the guest a virtio-net NIC joined to
#                        another guest's by a QEMU socket netdev on 127.0.0.1:PORT (the
#                        listening QEMU must be up first), and put rxe0 on it instead of a
#                        dummy netdev; needs SOFTROCE_VM_IP. run_pair.sh boots two this way.
#   SOFTROCE_VM_IP       the NIC's IPv4 address/prefix, e.g. 10.77.0.1/24 (also picks its MAC)
#   SOFTROCE_VM_HOSTNAME the guest's host name (default: unset, the kernel's "(none)")
#   SOFTROCE_VM_WATCHDOG seconds the command may run before the guest prints every process's
#                        kernel and user stacks (gdb), its network and kernel messages, and
#                        stops it with exit code 124
#                        (default: TIMEOUT less a quarter of it, 40 to 150 s; 0: off)
#   SOFTROCE_VM_STACKS_PEER  the watchdog also prints the processes of the guest at this
#                        address, through vm_rsh.py (run_pair.sh sets it for VM 1)
# The caller's whole environment is passed to CMD (see write_env below).
set -euo pipefail

# LD_PRELOAD / LD_LIBRARY_PATH are meant for CMD, not for QEMU and the host tools this
# script runs: stash them and re-exec without them. They are restored for CMD.
if [[ -z ${_SOFTROCE_VM_REEXEC:-} ]] && [[ -n ${LD_PRELOAD+x} || -n ${LD_LIBRARY_PATH+x} ]]; then
  export _SOFTROCE_VM_REEXEC=1
  [[ -n ${LD_PRELOAD+x} ]] && export _SOFTROCE_VM_SAVED_LD_PRELOAD=$LD_PRELOAD
  [[ -n ${LD_LIBRARY_PATH+x} ]] && export _SOFTROCE_VM_SAVED_LD_LIBRARY_PATH=$LD_LIBRARY_PATH
  exec env -u LD_PRELOAD -u LD_LIBRARY_PATH bash "${BASH_SOURCE[0]}" "$@"
fi

# Bazel's strict action env has PATH=/bin:/usr/bin:/usr/local/bin; modprobe lives in
# sbin. The caller's own PATH is what CMD gets (write_env).
CALLER_PATH=${PATH-}
export PATH=${PATH:+$PATH:}/usr/sbin:/sbin:/usr/bin:/bin

VM_DIR=${SOFTROCE_VM_DIR:-/var/tmp/rdmalloc-vm}
TIMEOUT=300
PREPARE_ONLY=0

cannot_start() { echo "vm: cannot start: $*" >&2; exit 125; }
usage() { sed -n '2,5p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2; exit 2; }

while [[ $# -gt 0 ]]; do
  case $1 in
    --timeout) [[ $# -ge 2 && $2 =~ ^[0-9]+$ && $2 -gt 0 ]] || usage; TIMEOUT=$2; shift 2 ;;
    --timeout=*) TIMEOUT=${1#*=}; [[ $TIMEOUT =~ ^[0-9]+$ && $TIMEOUT -gt 0 ]] || usage; shift ;;
    --prepare) PREPARE_ONLY=1; shift ;;
    --print-watchdog) PRINT_WATCHDOG=1; shift ;;
    -h|--help) usage ;;
    --) shift; break ;;
    -*) usage ;;
    *) break ;;
  esac
done

# The guest's watchdog: how long the command may run before the guest prints where
# each process is and stops it. The rest of TIMEOUT leaves time for the boot and that.
if [[ -n ${SOFTROCE_VM_WATCHDOG:-} ]]; then
  [[ $SOFTROCE_VM_WATCHDOG =~ ^[0-9]+$ ]] || usage
  WATCHDOG_S=$SOFTROCE_VM_WATCHDOG
else
  margin=$((TIMEOUT / 4))
  ((margin < 40)) && margin=40
  ((margin > 150)) && margin=150
  WATCHDOG_S=$((TIMEOUT - margin))
  ((WATCHDOG_S < TIMEOUT / 2)) && WATCHDOG_S=0   # too short a timeout to leave room
fi

[[ -z ${PRINT_WATCHDOG:-} ]] || { echo "$WATCHDOG_S"; exit 0; }
[[ $PREPARE_ONLY -eq 1 || $# -gt 0 ]] || usage

NET=${SOFTROCE_VM_NET:-}
NET_IP=${SOFTROCE_VM_IP:-}
if [[ -n $NET ]]; then
  [[ $NET =~ ^(listen|connect):[0-9]+$ ]] ||
    { echo "vm: SOFTROCE_VM_NET must be listen:PORT or connect:PORT, not '$NET'" >&2; exit 2; }
  [[ $NET_IP =~ ^([0-9]+)\.([0-9]+)\.([0-9]+)\.([0-9]+)/[0-9]+$ ]] ||
    { echo "vm: SOFTROCE_VM_NET needs SOFTROCE_VM_IP=A.B.C.D/LEN, not '$NET_IP'" >&2; exit 2; }
  # Each guest of a pair needs its own MAC (QEMU's default is the same for all): the
  # address's last two bytes.
  NET_MAC=$(printf '52:54:00:77:%02x:%02x' "${BASH_REMATCH[3]}" "${BASH_REMATCH[4]}")
fi

# ---------------------------------------------------------------------------------------
# Host prerequisites.
# ---------------------------------------------------------------------------------------
QEMU=$(command -v qemu-system-x86_64 || true)
[[ -n $QEMU ]] || cannot_start "qemu-system-x86_64 not installed (run test/vm/setup.sh)"
for tool in modprobe cpio gzip xz timeout; do
  command -v "$tool" >/dev/null || cannot_start "$tool not installed (run test/vm/setup.sh)"
done
BUSYBOX=/bin/busybox
# The initramfs has no libc, so busybox must be the static build (busybox-static).
[[ -x $BUSYBOX ]] && ! ldd "$BUSYBOX" >/dev/null 2>&1 ||
  cannot_start "static $BUSYBOX missing (install busybox-static via test/vm/setup.sh)"

# Newest installed kernel whose module tree has rdma_rxe (the running kernel may not).
pick_kernel() {
  local v
  if [[ -n ${SOFTROCE_VM_KVER:-} ]]; then echo "$SOFTROCE_VM_KVER"; return; fi
  for v in $(ls /boot/ 2>/dev/null | sed -n 's/^vmlinuz-//p' | sort -rV); do
    if modprobe -S "$v" --show-depends rdma_rxe >/dev/null 2>&1; then echo "$v"; return; fi
  done
}
KVER=$(pick_kernel)
[[ -n $KVER && -r /boot/vmlinuz-$KVER ]] ||
  cannot_start "no /boot/vmlinuz-* with rdma_rxe (install linux-image-amd64 via test/vm/setup.sh)"

# ---------------------------------------------------------------------------------------
# Guest PID 1 (busybox sh, runs from the initramfs).
# ---------------------------------------------------------------------------------------
read -r -d '' GUEST_INIT <<'EOF' || true
#!/bin/busybox sh
# Stage 1: mount the host root, overlay it, chroot and run the stage-2 script.
/bin/busybox --install -s /bin
export PATH=/bin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
R=
fail() {
  echo "vm-init: $*" >/dev/console
  [ -n "$R" ] && echo "$*" > /results/fail
  sync; poweroff -f
}
while read -r mod opts; do
  insmod "$mod" $opts || fail "insmod $mod failed"
done < /modules.order
P9=trans=virtio,version=9p2000.L,msize=512000
mount -t 9p -o $P9,cache=mmap results /results || fail "cannot mount results share"
R=$(sed -n 's/^results[[:space:]]*//p' /results/mounts)
# cache=loose: the host root does not change under us and it makes exec/reads fast.
mount -t 9p -o $P9,cache=loose,ro hostroot /lower || fail "cannot mount host root"
mount -t tmpfs -o mode=0755 tmpfs /rw
mkdir -p /rw/upper /rw/work
mount -t overlay -o lowerdir=/lower,upperdir=/rw/upper,workdir=/rw/work overlay /newroot ||
  fail "cannot mount overlay"
N=/newroot
mount -t proc proc $N/proc
mount -t sysfs sysfs $N/sys
mount -t devtmpfs devtmpfs $N/dev
mkdir -p $N/dev/pts $N/dev/shm
mount -t devpts -o newinstance,ptmxmode=0666 devpts $N/dev/pts
mount -t tmpfs -o mode=1777 tmpfs $N/dev/shm
mount -t tmpfs -o mode=0755 tmpfs $N/run
# Writable shares at their host paths (host sorted them parent-first).
while read -r tag path; do
  mkdir -p "$N$path"
  if [ "$tag" = results ]; then
    mount -o bind /results "$N$path" || fail "cannot bind results to $path"
  else
    mount -t 9p -o $P9,cache=mmap "$tag" "$N$path" || fail "cannot mount $path"
  fi
done < /results/mounts
# The kernel runs its module autoloader in the initramfs root; send it to the host's
# modprobe and module tree instead (else rdma_rxe fails to load crc32: ENOENT).
echo /sbin/modprobe-chroot > /proc/sys/kernel/modprobe
chroot $N /bin/bash "$R/guest.sh" </dev/null >/dev/console 2>&1 ||
  echo "vm-init: stage 2 exited $?" >/dev/console
sync
poweroff -f
EOF

read -r -d '' GUEST_STAGE2 <<'EOF' || true
#!/bin/bash
# Stage 2: runs chrooted in the host root. Sets up rxe0, then runs the command.
set -uo pipefail
R=${BASH_SOURCE[0]%/*}
fail() { echo "$*" > "$R/fail"; echo "vm-guest: $*" >&2; exit 1; }

# virtio serial ports carry CMD's stdout/stderr and timing markers to the host.
port() {
  local d i
  for ((i = 0; i < 100; i++)); do
    for d in /sys/class/virtio-ports/*; do
      [[ -r $d/name && $(<"$d/name") == "$1" ]] && { echo "/dev/${d##*/}"; return 0; }
    done
    sleep 0.05
  done
  return 1
}
CTL=$(port rdmalloc.ctl) && OUT=$(port rdmalloc.out) && ERR=$(port rdmalloc.err) ||
  fail "virtio serial ports missing"
exec 3>"$CTL"

# The kernel hands PID 1 no PATH and stage 1 only set /bin; the caller's PATH comes later.
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
source "$R/net.sh"   # NET_IP, NET_HOSTNAME: empty unless SOFTROCE_VM_NET/_HOSTNAME are set
setup_rxe() {
  # Explicit checks: `set -e` is void inside a function called from `||`.
  local dev=rxedummy0 i s gid=
  ip link set lo up &&
  modprobe rdma_rxe || return 1
  if [[ -n $NET_IP ]]; then
    # The initramfs loads only what mounting the host root needs; the NIC's driver comes
    # from the host's module tree like rdma_rxe. No udev here: take the one netdev
    # backed by a device, whatever the kernel named it.
    modprobe virtio_net || return 1
    dev=
    for ((i = 0; i < 100; i++)); do
      for s in /sys/class/net/*; do [[ -e $s/device ]] && dev=${s##*/}; done
      [[ -n $dev ]] && break
      sleep 0.05
    done
    [[ -n $dev ]] || { echo "no virtio-net netdev appeared"; return 1; }
    ip addr add "$NET_IP" dev "$dev" && ip link set "$dev" up || return 1
    # rxe's GID for the IPv4 address (::ffff:a.b.c.d, as sysfs prints it). The GID table is
    # filled asynchronously; programs pick this entry (test/vm/rc_peer.h), so wait for it.
    gid=$(IFS=./ read -r a b c d _ <<<"$NET_IP"; printf '0000:0000:0000:0000:0000:ffff:%02x%02x:%02x%02x' "$a" "$b" "$c" "$d")
  else
    modprobe dummy numdummies=0 &&
    ip link add "$dev" type dummy &&
    ip link set "$dev" up || return 1
  fi
  rdma link add rxe0 type rxe netdev "$dev" || return 1
  # The port goes ACTIVE asynchronously once the netdev is up.
  for ((i = 0; i < 200; i++)); do
    s=$(cat /sys/class/infiniband/rxe0/ports/1/state 2>/dev/null || true)
    if [[ $s == *ACTIVE* ]] && { [[ -z $gid ]] || grep -qx "$gid" /sys/class/infiniband/rxe0/ports/1/gids/* 2>/dev/null; }; then
      return 0
    fi
    sleep 0.05
  done
  echo "rxe0 port state: ${s:-missing}${gid:+, GID $gid not in its table}"
  return 1
}
[[ -z $NET_HOSTNAME ]] || hostname "$NET_HOSTNAME" || fail "cannot set the host name $NET_HOSTNAME"
setup_rxe >"$R/setup.log" 2>&1 || fail "rxe0 setup failed: $(tail -n 3 "$R/setup.log" | tr '\n' ' ')"

source "$R/cmd.sh"   # CMD=(...), CWD=...
source "$R/env.sh"   # the caller's environment
cd -- "$CWD" || fail "cannot cd to $CWD in the guest"
ulimit -l unlimited || fail "ulimit -l unlimited failed"
# Each port is opened once (a second open is refused): the watchdog writes through fd 5.
exec 4>"$OUT" 5>"$ERR"
export SOFTROCE_VM_STACKS=$R/stacks.sh   # also what a peer guest runs through vm_rsh.py
echo start >&3
# Its own process group, so that the watchdog can stop all of it.
setsid "${CMD[@]}" </dev/null >&4 2>&5 3>&- 4>&- 5>&- &
cmd_pid=$!
# A command still running WATCHDOG_S s after it started is hung: print where every
# process is (here and, in a pair, in the peer guest), then stop it, before the host's
# timeout kills the guest with nothing said.
watchdog() {
  sleep "$WATCHDOG_S" 3>&- 5>&-
  kill -0 "$cmd_pid" 2>/dev/null || return 0
  : >"$R/watchdog"
  {
    echo "vm: watchdog: the command still runs after $WATCHDOG_S s; where each process is:"
    bash "$SOFTROCE_VM_STACKS"
    if [[ -n ${SOFTROCE_VM_STACKS_PEER:-} && -n ${SOFTROCE_PAIR_RSH:-} ]]; then
      echo "vm: watchdog: and in the peer guest $SOFTROCE_VM_STACKS_PEER, whose server at port 7070" \
        "$(python3 "$SOFTROCE_PAIR_RSH" --probe "$SOFTROCE_VM_STACKS_PEER" &&
           echo "accepts a connection" || echo "CANNOT BE REACHED")":
      timeout 60 python3 "$SOFTROCE_PAIR_RSH" "$SOFTROCE_VM_STACKS_PEER" 'bash "$SOFTROCE_VM_STACKS"' ||
        echo "vm: watchdog: no answer from $SOFTROCE_VM_STACKS_PEER within 60 s (its own watchdog reports)"
    fi
    echo "vm: watchdog: stopping the command (SIGTERM, then SIGKILL 5 s later)"
  } >&5 2>&1 3>&-
  kill -TERM -- "-$cmd_pid" 2>/dev/null
  sleep 5 3>&- 5>&-
  kill -KILL -- "-$cmd_pid" 2>/dev/null
  return 0
}
watchdog_pid=
[[ $WATCHDOG_S -gt 0 ]] && { watchdog 4>&- & watchdog_pid=$!; }
wait "$cmd_pid"
rc=$?
[[ -n $watchdog_pid ]] && { kill "$watchdog_pid"; wait "$watchdog_pid"; } 2>/dev/null
if [[ -e $R/watchdog ]]; then
  kill -KILL -- "-$cmd_pid" 2>/dev/null
  rc=124
fi
echo "$rc" > "$R/rc"
echo "end $rc" >&3
exec 3>&- 4>&- 5>&-
EOF

# Where every user process of the guest is, for a hung command: each thread's kernel
# stack and, through gdb when installed, its user stack. Leaves out itself, its
# ancestors (the harness) and kernel threads.
read -r -d '' STACKS_SCRIPT <<'EOF' || true
#!/bin/bash
set -u
skip=" $$ "
p=$$
while p=$(awk '/^PPid:/ { print $2 }' "/proc/$p/status" 2>/dev/null) && [[ -n $p && $p != 0 ]]; do
  skip+="$p "
done
have_gdb=0
command -v gdb >/dev/null && have_gdb=1
echo "== $(hostname): processes at uptime $(cut -d' ' -f1 /proc/uptime) s"
[[ $have_gdb == 1 ]] || echo "== gdb is not installed: kernel stacks only"
for d in /proc/[0-9]*; do
  pid=${d#/proc/}
  [[ $skip == *" $pid "* ]] && continue
  args=$(tr '\0' ' ' 2>/dev/null <"$d/cmdline" | cut -c1-200)
  [[ -n $args ]] || continue   # kernel threads, and processes gone meanwhile
  comm=$(cat "$d/comm" 2>/dev/null) || continue
  echo "== pid $pid ($comm) ppid $(awk '/^PPid:/ { print $2 }' "$d/status") $(grep -m1 '^State:' "$d/status"): $args"
  for t in "$d"/task/*; do
    echo "   thread ${t##*/} ($(cat "$t/comm" 2>/dev/null)) wchan $(cat "$t/wchan" 2>/dev/null), syscall $(cut -d' ' -f1 "$t/syscall" 2>/dev/null)"
    sed 's/^/     k /' "$t/stack" 2>/dev/null
  done
  case $comm in bash|sh|sleep|timeout|cat|tee|sed|awk|python3|setsid) continue ;; esac
  [[ $have_gdb == 1 ]] &&
    timeout 30 gdb -p "$pid" -batch -nx -q -iex 'set debuginfod enabled off' \
      -ex 'set pagination off' -ex 'thread apply all bt 25' </dev/null 2>&1 |
      grep -E '^(Thread|#)' | sed 's/^/     u /'
done
echo "== $(hostname): network"
ip -s link show 2>&1 | sed 's/^/   /'
ss -tanp 2>&1 | sed 's/^/   /'
echo "== $(hostname): the kernel's last messages"
dmesg 2>&1 | tail -n 120 | sed 's/^/   /'
echo "== end of $(hostname)"
EOF

read -r -d '' MODPROBE_WRAPPER <<'EOF' || true
#!/bin/busybox sh
exec /bin/busybox chroot /newroot /sbin/modprobe "$@"
EOF

# Modules the initramfs needs before the host root is mounted; everything else
# (rdma_rxe, dummy, ...) is loaded from the host's module tree after the chroot.
INITRD_MODULES=(virtio_pci virtio_console 9pnet_virtio 9p overlay)

# ---------------------------------------------------------------------------------------
# Cached kernel + initramfs, keyed by kernel version/build, busybox and this script.
# ---------------------------------------------------------------------------------------
CACHE_KEY=$(printf '%s\n' "$KVER" "$(stat -c '%s %Y' "/boot/vmlinuz-$KVER")" \
  "$(sha256sum <"${BASH_SOURCE[0]}")" "$(stat -c '%s %Y' "$BUSYBOX")" |
  sha256sum | cut -c1-12)

# The fast PVH boot needs the uncompressed ELF vmlinux inside the bzImage (xz payload
# on Debian). Try each xz magic until one unpacks to an ELF file.
extract_vmlinux() {
  local src=$1 dst=$2 off
  for off in $(LC_ALL=C grep -obUaP '\xfd7zXZ\x00' "$src" | cut -d: -f1); do
    # Process substitution, not a pipe: xz stops reading early and tail's SIGPIPE
    # would fail the pipeline under pipefail.
    if xz -dc --single-stream < <(tail -c +$((off + 1)) "$src") >"$dst" 2>/dev/null &&
       [[ $(head -c 4 "$dst" | od -An -c | tr -d ' ') == '177ELF' ]]; then
      return 0
    fi
  done
  return 1
}

build_cache() {
  local out=$1 root=$1/root path opts dst
  if ! extract_vmlinux "/boot/vmlinuz-$KVER" "$out/kernel"; then
    # Slower (bzImage decompresses itself) but still boots.
    echo "vm: note: could not unpack vmlinux, booting the compressed kernel" >&2
    cp "/boot/vmlinuz-$KVER" "$out/kernel"
  fi
  mkdir -p "$root"/{bin,sbin,dev,proc,sys,lower,rw,newroot,results}
  cp "$BUSYBOX" "$root/bin/busybox"
  : >"$root/modules.order"
  # --show-depends lists every dependency in load order; -a takes several names.
  while read -r _ path opts; do
    dst=$root$path
    mkdir -p "${dst%/*}"
    case $path in
      *.ko) cp "$path" "$dst" ;;
      *.ko.xz) xz -dc "$path" >"${dst%.xz}"; path=${path%.xz} ;;
      *.ko.gz) gzip -dc "$path" >"${dst%.gz}"; path=${path%.gz} ;;
      *.ko.zst) zstd -qdc "$path" >"${dst%.zst}"; path=${path%.zst} ;;
      *) echo "vm: unknown module format $path" >&2; return 1 ;;
    esac
    echo "$path $opts" >>"$root/modules.order"
  done < <(modprobe -S "$KVER" -a --show-depends "${INITRD_MODULES[@]}" |
           awk '$1 == "insmod" && !seen[$2]++')
  printf '%s\n' "$GUEST_INIT" >"$root/init"
  printf '%s\n' "$MODPROBE_WRAPPER" >"$root/sbin/modprobe-chroot"
  chmod 0755 "$root/init" "$root/sbin/modprobe-chroot"
  (cd "$root" && find . | LC_ALL=C sort | cpio -o -H newc -R 0:0 --quiet) | gzip -1 >"$out/initrd.gz"
  rm -rf "$root"
  write_prefetch_list >"$out/prefetch.list"
}

# Host files the guest reads over 9p while it sets up rxe0 (plus the verbs libraries
# nearly every CMD loads). Reading them on the host while the guest kernel boots keeps
# a cold page cache from adding seconds to the boot. A stale entry only costs nothing.
write_prefetch_list() {
  local b bins=()
  for b in bash kmod ip rdma; do b=$(command -v "$b") && bins+=("$(realpath "$b")"); done
  {
    printf '%s\n' "${bins[@]}"
    ldd "${bins[@]}" 2>/dev/null | awk '$2 == "=>" && $3 ~ /^\// { print $3 } $1 ~ /^\// { print $1 }'
    modprobe -S "$KVER" -a --show-depends rdma_rxe dummy virtio_net crc32_generic 2>/dev/null |
      awk '$1 == "insmod" { print $2 }'
    ls -d /lib/modules/"$KVER"/modules.*.bin /etc/modprobe.d/* /etc/libibverbs.d/* \
      /usr/lib/x86_64-linux-gnu/libibverbs.so.1* /usr/lib/x86_64-linux-gnu/libibverbs/librxe* \
      2>/dev/null
  } | LC_ALL=C sort -u
  return 0
}

# Returns the cache dir on stdout. Builds into a temp dir and renames it into place so
# concurrent runs never see a half-written cache.
prepare_cache() {
  local final=$VM_DIR/cache/$KVER-$CACHE_KEY tmp
  if [[ -s $final/kernel && -s $final/initrd.gz ]]; then echo "$final"; return; fi
  if mkdir -p "$VM_DIR/cache" 2>/dev/null && tmp=$(mktemp -d "$VM_DIR/cache/.build.XXXXXX" 2>/dev/null); then
    build_cache "$tmp" || { rm -rf "$tmp"; return 1; }
    chmod 0755 "$tmp"
    if mv -T "$tmp" "$final" 2>/dev/null; then
      # Drop caches of other kernels / older versions of this script.
      find "$VM_DIR/cache" -mindepth 1 -maxdepth 1 ! -name "$KVER-$CACHE_KEY" ! -name '.build.*' \
        -exec rm -rf {} + 2>/dev/null || true
    else
      rm -rf "$tmp"   # another run won the race
    fi
    echo "$final"
  else
    # Read-only work dir (e.g. inside a Bazel sandbox): build a private copy.
    tmp=$(mktemp -d)
    build_cache "$tmp" || return 1
    echo "$tmp"
  fi
}

CACHE=$(prepare_cache) || cannot_start "could not build the kernel/initramfs cache"
if [[ $PREPARE_ONLY -eq 1 ]]; then
  echo "vm: cache ready in $CACHE (kernel $KVER)" >&2
  exit 0
fi

# ---------------------------------------------------------------------------------------
# Per-run results dir: instructions for the guest, exit code, logs.
# ---------------------------------------------------------------------------------------
if mkdir -p "$VM_DIR/runs" 2>/dev/null && [[ -w $VM_DIR/runs ]]; then
  # Leftovers of runs that were SIGKILLed.
  find "$VM_DIR/runs" -mindepth 1 -maxdepth 1 -mmin +1440 -exec rm -rf {} + 2>/dev/null || true
  R=$(mktemp -d "$VM_DIR/runs/run.XXXXXX")
else
  R=$(mktemp -d "${TMPDIR:-/tmp}/rdmalloc-vm-run.XXXXXX")
fi
R=$(realpath "$R")
[[ $CACHE == "$VM_DIR"/cache/* ]] || PRIVATE_CACHE=$CACHE

PIDS=()
QPID=
INTERRUPTED=
cleanup() {
  local p f
  [[ -n $QPID ]] && kill -TERM "$QPID" 2>/dev/null || true
  # A reader still blocked in open() (QEMU died early) is released by a dummy writer.
  for f in "$R"/*.fifo; do [[ -p $f ]] && { exec {fd}<>"$f"; exec {fd}>&-; } ; done 2>/dev/null || true
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  if [[ ${SOFTROCE_VM_KEEP:-0} == 1 ]]; then echo "vm: results kept in $R" >&2; else rm -rf "$R"; fi
  [[ -n ${PRIVATE_CACHE:-} ]] && rm -rf "$PRIVATE_CACHE"
  return 0
}
trap cleanup EXIT
trap 'INTERRUPTED=1; [[ -n $QPID ]] && kill -TERM "$QPID" 2>/dev/null' TERM INT HUP

# The command, quoted for bash, and the caller's working directory.
CWD=$(pwd)
{
  printf 'CMD=('; printf ' %q' "$@"; printf ' )\n'
  printf 'CWD=%q\n' "$CWD"
  printf 'WATCHDOG_S=%d\n' "$WATCHDOG_S"
} >"$R/cmd.sh"

# The caller's environment, minus shell bookkeeping and this script's own variables.
write_env() {
  local name
  for name in $(compgen -e); do
    case $name in
      PWD|OLDPWD|SHLVL|_|PATH|_SOFTROCE_VM_*) continue ;;  # PATH: added below
      SHELLOPTS|BASHOPTS|BASH_VERSINFO|EUID|UID|PPID) continue ;;  # readonly in bash
    esac
    printf 'export %s=%q\n' "$name" "${!name}"
  done
  printf 'export PATH=%q\n' "$CALLER_PATH"
  [[ -n ${_SOFTROCE_VM_SAVED_LD_PRELOAD+x} ]] &&
    printf 'export LD_PRELOAD=%q\n' "$_SOFTROCE_VM_SAVED_LD_PRELOAD"
  [[ -n ${_SOFTROCE_VM_SAVED_LD_LIBRARY_PATH+x} ]] &&
    printf 'export LD_LIBRARY_PATH=%q\n' "$_SOFTROCE_VM_SAVED_LD_LIBRARY_PATH"
  return 0
}
write_env >"$R/env.sh"
printf '%s\n' "$GUEST_STAGE2" >"$R/guest.sh"
printf '%s\n' "$STACKS_SCRIPT" >"$R/stacks.sh"
printf 'NET_IP=%q\nNET_HOSTNAME=%q\n' "$NET_IP" "${SOFTROCE_VM_HOSTNAME:-}" >"$R/net.sh"

# Host dirs the guest may write to (everything else is a discarded overlay). These are
# the places a Bazel test writes results: TEST_TMPDIR, test.xml's dir, undeclared outputs.
rw_candidates=()
add_rw() { [[ -n ${1:-} ]] && rw_candidates+=("$1"); return 0; }
add_rw "${TEST_TMPDIR:-}"
[[ -n ${XML_OUTPUT_FILE:-} ]] && add_rw "$(dirname -- "$XML_OUTPUT_FILE")"
add_rw "${TEST_UNDECLARED_OUTPUTS_DIR:-}"
add_rw "${TEST_UNDECLARED_OUTPUTS_ANNOTATIONS_DIR:-}"
for f in TEST_PREMATURE_EXIT_FILE TEST_INFRASTRUCTURE_FAILURE_FILE TEST_WARNINGS_OUTPUT_FILE \
         TEST_SHARD_STATUS_FILE TEST_UNUSED_RUNFILES_LOG_FILE; do
  [[ -n ${!f:-} ]] && add_rw "$(dirname -- "${!f}")"
done
IFS=: read -r -a extra_rw <<<"${SOFTROCE_VM_RW:-}"
for d in "${extra_rw[@]}"; do add_rw "$d"; done

# Resolve symlinks (the guest mounts outside the chroot, where symlinks would resolve
# against the initramfs), drop duplicates and dirs nested in another share.
rw_dirs=()
for d in "${rw_candidates[@]}"; do
  [[ $d == /* ]] || d=$CWD/$d
  mkdir -p -- "$d" 2>/dev/null || { echo "vm: warning: cannot create $d; writes there are lost" >&2; continue; }
  d=$(realpath -- "$d")
  [[ $d == / ]] && { echo "vm: warning: refusing to share / writable" >&2; continue; }
  rw_dirs+=("$d")
done
mapfile -t rw_dirs < <(printf '%s\n' "${rw_dirs[@]+"${rw_dirs[@]}"}" | sed '/^$/d' | LC_ALL=C sort -u)
shares=()
{
  kept=()
  for d in "${rw_dirs[@]+"${rw_dirs[@]}"}"; do
    nested=0
    for k in "${kept[@]+"${kept[@]}"}"; do [[ $d == "$k"/* ]] && nested=1; done
    [[ $nested -eq 1 ]] && continue
    kept+=("$d")
    i=${#kept[@]}
    printf 'rw%d %s\n' "$i" "$d"
    shares+=(-virtfs "local,path=$d,mount_tag=rw$i,security_model=none,multidevs=remap")
  done
  # Last, so it lands on top even if it lies inside one of the shares above.
  printf 'results %s\n' "$R"
} >"$R/mounts"

# ---------------------------------------------------------------------------------------
# Boot.
# ---------------------------------------------------------------------------------------
accel=${SOFTROCE_VM_ACCEL:-}
if [[ -z $accel ]]; then
  # kvm_pvm (nested "PVM" KVM) cannot run a stock kernel, so emulate instead.
  if [[ ! -e /sys/module/kvm_pvm ]] && [[ -r /dev/kvm && -w /dev/kvm ]] &&
     { exec {kfd}<>/dev/kvm; } 2>/dev/null; then
    exec {kfd}>&-
    accel=kvm
  else
    accel=tcg
  fi
fi
case $accel in
  kvm) accel_args=(-accel kvm -cpu host) ;;
  tcg) accel_args=(-accel tcg,thread=multi -cpu max) ;;
  *) cannot_start "SOFTROCE_VM_ACCEL must be kvm or tcg, not '$accel'" ;;
esac
smp=${SOFTROCE_VM_SMP:-$(nproc)}
((smp > 4)) && smp=4

# Streams come out through FIFOs read by host-side cat: byte-exact, stdout and stderr
# kept apart, kernel console kept out of them.
for f in console ctl out err; do mkfifo "$R/$f.fifo"; done
if [[ ${SOFTROCE_VM_VERBOSE:-0} == 1 ]]; then
  tee "$R/console.log" <"$R/console.fifo" >&2 & PIDS+=($!)
else
  cat <"$R/console.fifo" >"$R/console.log" & PIDS+=($!)
fi
(while IFS= read -r line; do printf '%s %s\n' "${EPOCHREALTIME/[.,]/}" "$line"; done \
  <"$R/ctl.fifo" >"$R/ctl.log") & PIDS+=($!)
cat <"$R/out.fifo" & OUT_PID=$!; PIDS+=($OUT_PID)
cat <"$R/err.fifo" >&2 & ERR_PID=$!; PIDS+=($ERR_PID)

qemu_args=(
  -name rdmalloc-vm -machine pc "${accel_args[@]}" -m "${SOFTROCE_VM_MEM:-2G}" -smp "$smp"
  -nodefaults -no-user-config -display none -no-reboot
  -kernel "$CACHE/kernel" -initrd "$CACHE/initrd.gz"
  -append "console=ttyS0 quiet loglevel=3 panic=-1 rdinit=/init ${SOFTROCE_VM_APPEND:-}"
  -chardev "file,id=con,path=$R/console.fifo" -serial chardev:con
  -device virtio-serial-pci,id=vser
  -chardev "file,id=ctl,path=$R/ctl.fifo" -device virtserialport,bus=vser.0,chardev=ctl,name=rdmalloc.ctl
  -chardev "file,id=out,path=$R/out.fifo" -device virtserialport,bus=vser.0,chardev=out,name=rdmalloc.out
  -chardev "file,id=err,path=$R/err.fifo" -device virtserialport,bus=vser.0,chardev=err,name=rdmalloc.err
  -virtfs "local,path=/,mount_tag=hostroot,security_model=none,readonly=on,multidevs=remap"
  -virtfs "local,path=$R,mount_tag=results,security_model=none,multidevs=remap"
  "${shares[@]+"${shares[@]}"}"
)
if [[ -n $NET ]]; then
  qemu_args+=(-netdev "socket,id=n0,${NET%%:*}=127.0.0.1:${NET#*:}"
              -device "virtio-net-pci,netdev=n0,mac=$NET_MAC")
else
  qemu_args+=(-nic none)
fi

T0=${EPOCHREALTIME/[.,]/}
# Warm the host page cache in parallel with the guest's kernel boot (see build_cache).
{ cat "$CACHE/prefetch.list" 2>/dev/null; command -v -- "$1" 2>/dev/null || true; } |
  xargs -d '\n' cat -- >/dev/null 2>&1 & PREFETCH_PID=$!; PIDS+=($PREFETCH_PID)
# timeout(1) puts QEMU in its own process group and kills it (then SIGKILL 5 s later).
timeout -k 5 "$TIMEOUT" "$QEMU" "${qemu_args[@]}" </dev/null >"$R/qemu.log" 2>&1 &
QPID=$!
qrc=0
wait "$QPID" || qrc=$?
if [[ -n $INTERRUPTED ]]; then
  wait "$QPID" 2>/dev/null || true
  QPID=
  echo "vm: interrupted" >&2
  exit 143
fi
QPID=
T1=${EPOCHREALTIME/[.,]/}
kill "$PREFETCH_PID" 2>/dev/null || true
# Let the stream readers drain what QEMU wrote before it exited.
for f in "$R"/*.fifo; do { exec {fd}<>"$f"; exec {fd}>&-; } 2>/dev/null || true; done
wait "$OUT_PID" "$ERR_PID" 2>/dev/null || true
wait "${PIDS[@]}" 2>/dev/null || true

secs() { awk -v us="$1" 'BEGIN { printf "%.1f", us / 1e6 }'; }
t_start=$(awk '$2 == "start" { print $1; exit }' "$R/ctl.log" 2>/dev/null || true)
t_end=$(awk '$2 == "end" { print $1; exit }' "$R/ctl.log" 2>/dev/null || true)
rc=$(cat "$R/rc" 2>/dev/null || true)

console_tail() { tail -n 15 "$R/console.log" 2>/dev/null | sed 's/^/vm: console: /' >&2 || true; }

if [[ -n $t_end && $rc =~ ^[0-9]+$ && -e $R/watchdog ]]; then
  echo "vm: timed out: the guest's watchdog stopped the command after $WATCHDOG_S s (booted in $(secs $((t_start - T0))) s); where each process was is above" >&2
  console_tail
  exit 124
fi
if [[ -n $t_end && $rc =~ ^[0-9]+$ ]]; then
  echo "vm: booted in $(secs $((t_start - T0))) s, command ran $(secs $((t_end - t_start))) s, exit $rc" >&2
  exit "$rc"
fi
if [[ $qrc -eq 124 || $qrc -eq 137 ]]; then
  if [[ -n $t_start ]]; then
    echo "vm: timed out after $TIMEOUT s (booted in $(secs $((t_start - T0))) s, command killed after $(secs $((T1 - t_start))) s)" >&2
    console_tail
  else
    echo "vm: timed out after $TIMEOUT s before the command started" >&2
    console_tail
  fi
  exit 124
fi
if [[ -s $R/fail ]]; then
  cannot_start "$(head -c 500 "$R/fail")"
fi
if [[ -z $t_start ]]; then
  if [[ $qrc -ne 0 ]]; then
    cannot_start "qemu exited $qrc: $(grep -v '^$' "$R/qemu.log" | tail -n 1)"
  fi
  console_tail
  cannot_start "guest stopped before the command started (see console above)"
fi
# The command started but the guest went away without reporting (kernel crash?).
echo "vm: guest stopped while the command ran ($(secs $((T1 - t_start))) s, qemu exit $qrc)" >&2
console_tail
exit 125
