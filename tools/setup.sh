#!/bin/bash
# Installs what building and testing rdmalloc needs, from Debian's archive.
set -euo pipefail
if [ "$(id -u)" -ne 0 ]; then exec sudo "$0" "$@"; fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -q

# rdmalloc builds jemalloc from Debian's source package (apt-get source
# jemalloc: third_party/jemalloc_source.sh), and so do jemalloc's integration
# tests in test/suites; that needs deb-src entries. Add them, once, for the
# Debian archive the binary packages come from.
if [ -z "$(apt-get indextargets --format '$(SITE)' 'Created-By: Sources' 'Origin: Debian')" ]; then
  keyring=/usr/share/keyrings/debian-archive-keyring.gpg
  opts=""
  [ -f "$keyring" ] && opts="[signed-by=$keyring] "
  apt-get indextargets --format '$(REPO_URI) $(RELEASE) $(COMPONENT)' \
      'Created-By: Packages' 'Origin: Debian' | sort -u |
    while read -r uri release component; do
      echo "deb-src $opts$uri $release $component"
    done > /etc/apt/sources.list.d/rdmalloc-deb-src.list
  if [ ! -s /etc/apt/sources.list.d/rdmalloc-deb-src.list ]; then
    echo "setup.sh: no Debian archive among the apt sources; cannot add deb-src" >&2
    exit 1
  fi
  apt-get update -q
fi
apt-get install -y -q --no-install-recommends \
  bazel-bootstrap g++ binutils ca-certificates \
  libjemalloc-dev libjemalloc2 liburing-dev libibverbs-dev ibverbs-providers \
  libgtest-dev libbenchmark-dev libexpat1-dev \
  clang libclang-rt-14-dev valgrind \
  python3 sqlite3 coreutils procps pkg-config \
  libpython3.11-testsuite dpkg-dev make bzip2 xz-utils gdb \
  libucx-dev libfabric-dev libfabric-bin gnuplot-nox \
  openmpi-bin libopenmpi-dev
