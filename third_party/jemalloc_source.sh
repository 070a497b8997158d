#!/bin/bash
# Debian's jemalloc source, configured the way Debian builds libjemalloc2 on
# amd64 (debian/rules: --with-lg-page=12 --with-lg-hugepage=21 --enable-prof,
# dpkg-buildflags), optionally patched first:
#
#   jemalloc_source.sh WORKDIR [PATCH]
#
# leaves the configured tree in WORKDIR/src, the installed libjemalloc2's
# version in WORKDIR/version, the configure options in WORKDIR/configure and
# everything logged in WORKDIR/build.log. The source is the installed
# version's, from apt-get source (tools/setup.sh adds the deb-src entries).
set -euo pipefail
work=$(realpath -m "$1")
patch_file=${2:+$(realpath "$2")}
mkdir -p "$work"
log=$work/build.log
: >"$log"
version=$(dpkg-query -W -f='${source:Version}' libjemalloc2 2>/dev/null) || {
  echo "jemalloc_source: libjemalloc2 is not installed: run tools/setup.sh" >&2; exit 1; }
cd "$work"
ok=0
for try in 1 2 3; do
  if apt-get source --download-only "jemalloc=$version" >>"$log" 2>&1; then ok=1; break; fi
  sleep $((try * 5))
done
if [ $ok -ne 1 ]; then
  cat "$log" >&2
  echo "jemalloc_source: 'apt-get source jemalloc=$version' failed (no deb-src entry? run tools/setup.sh)" >&2
  exit 1
fi
dpkg-source -x "jemalloc_${version#*:}.dsc" src >>"$log" 2>&1 || {
  cat "$log" >&2; echo "jemalloc_source: dpkg-source -x failed" >&2; exit 1; }
cd src
if [ -n "$patch_file" ]; then
  patch -p1 <"$patch_file" >>"$log" 2>&1 || {
    cat "$log" >&2; echo "jemalloc_source: $patch_file does not apply to jemalloc $version" >&2; exit 1; }
fi

arch=$(dpkg-architecture -qDEB_HOST_ARCH)
if [ "$arch" != amd64 ]; then
  echo "jemalloc_source: only amd64's configuration is reproduced here (this is $arch)" >&2
  exit 1
fi
eval "$(DEB_BUILD_MAINT_OPTIONS= dpkg-buildflags --export=sh)"
config=(--with-version=VERSION --with-lg-page=12 --with-lg-hugepage=21 --enable-prof)
echo "configure ${config[*]}" >>"$log"
./configure "${config[@]}" >>"$log" 2>&1 || {
  tail -50 "$log" >&2; echo "jemalloc_source: configure failed" >&2; exit 1; }
echo "$version" >"$work/version"
echo "${config[*]}" >"$work/configure"
