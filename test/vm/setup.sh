#!/usr/bin/env bash
# Installs what test/vm/run.sh needs to boot a soft-RoCE (rdma_rxe) VM.
# Idempotent: re-running only installs what is missing.
# Usage (as root, Debian 12): test/vm/setup.sh
set -euo pipefail

# qemu-system-x86: the VM. linux-image-amd64: a Debian kernel that ships rdma_rxe.ko
# (the host kernel may have no InfiniBand at all). busybox-static: the initramfs userland.
# rdma-core/ibverbs-*/perftest/rdmacm-utils/iproute2: rdma tool, verbs libraries, checks.
# kmod: modprobe --show-depends for the initramfs. cpio: packs it. xz-utils: unpacks
# the kernel's xz payload for the fast PVH boot. gcc/libc6-dev: build verbs_loopback.c.
# coreutils: timeout(1), the host-side watchdog.
PKGS=(
  qemu-system-x86 linux-image-amd64 busybox-static
  rdma-core ibverbs-utils ibverbs-providers libibverbs-dev perftest rdmacm-utils
  iproute2 kmod cpio xz-utils gcc libc6-dev coreutils
)

if [[ $(id -u) -ne 0 ]]; then
  echo "setup.sh: must run as root (apt-get install)" >&2
  exit 1
fi

missing=()
for p in "${PKGS[@]}"; do
  # dpkg-query prints "install ok installed" only for fully installed packages.
  if [[ $(dpkg-query -W -f='${Status}' "$p" 2>/dev/null) != "install ok installed" ]]; then
    missing+=("$p")
  fi
done

# A kernel package alone is not enough: the modules tree must match a vmlinuz in /boot.
have_kernel=0
for k in /boot/vmlinuz-*; do
  [[ -e $k ]] || continue
  v=${k#/boot/vmlinuz-}
  if [[ -e /lib/modules/$v/kernel/drivers/infiniband/sw/rxe/rdma_rxe.ko ]] ||
     [[ -e /lib/modules/$v/kernel/drivers/infiniband/sw/rxe/rdma_rxe.ko.xz ]]; then
    have_kernel=1
  fi
done

if [[ ${#missing[@]} -eq 0 && $have_kernel -eq 1 ]]; then
  echo "setup.sh: packages already installed"
else
  export DEBIAN_FRONTEND=noninteractive
  apt-get update
  # --no-install-recommends keeps it small (no firmware, no GUI bits of qemu).
  apt-get install -y --no-install-recommends "${PKGS[@]}"
fi

# Build the cached kernel + initramfs now, so the first VM run (possibly inside a
# Bazel sandbox, where the cache dir may be read-only) does not have to.
"$(dirname "${BASH_SOURCE[0]}")/run.sh" --prepare
echo "setup.sh: done"
