#!/bin/bash
# Installs what building and testing rdmalloc needs, from Debian's archive.
set -euo pipefail
if [ "$(id -u)" -ne 0 ]; then exec sudo "$0" "$@"; fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -q
apt-get install -y -q --no-install-recommends \
  bazel-bootstrap g++ binutils ca-certificates \
  libjemalloc-dev libjemalloc2 liburing-dev libibverbs-dev ibverbs-providers \
  libgtest-dev libbenchmark-dev libexpat1-dev \
  clang libclang-rt-14-dev valgrind \
  python3 sqlite3 coreutils procps pkg-config \
  libucx-dev libfabric-dev gnuplot-nox \
  openmpi-bin libopenmpi-dev
