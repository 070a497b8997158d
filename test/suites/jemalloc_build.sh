#!/bin/bash
# Builds jemalloc's integration tests from Debian's source package, the way
# Debian builds libjemalloc2 on amd64 (debian/rules: --with-lg-page=12
# --with-lg-hugepage=21 --enable-prof, dpkg-buildflags), and packs what the
# test needs into one tarball: the fresh libjemalloc.so.2, every integration
# program's object file and .sh, the harness objects, the link flags and the
# list of programs from the Makefile. //test/suites:jemalloc_integration_test
# links the programs twice (against that library and against librdmalloc.so)
# and compares them. Nothing of jemalloc is committed: the source comes from
# apt-get source (tools/setup.sh adds the deb-src entries).
#
#   jemalloc_build.sh OUT.tar.gz
set -euo pipefail
out=$(realpath -m "$1")
version=$(dpkg-query -W -f='${source:Version}' libjemalloc2 2>/dev/null) || {
  echo "jemalloc_build: libjemalloc2 is not installed: run tools/setup.sh" >&2; exit 1; }
work=$(mktemp -d /tmp/rdm-jemalloc-build.XXXXXX)
trap 'rm -rf "$work"' EXIT
cd "$work"
log=$work/build.log

# The source package of the jemalloc that is installed (the same version as
# Debian's libjemalloc_pic.a inside rdmalloc and the stock libjemalloc.so.2).
ok=0
for try in 1 2 3; do
  if apt-get source --download-only "jemalloc=$version" >>"$log" 2>&1; then ok=1; break; fi
  sleep $((try * 5))
done
if [ $ok -ne 1 ]; then
  cat "$log" >&2
  echo "jemalloc_build: 'apt-get source jemalloc=$version' failed (no deb-src entry? run tools/setup.sh)" >&2
  exit 1
fi
dpkg-source -x "jemalloc_${version#*:}.dsc" src >>"$log" 2>&1 || {
  cat "$log" >&2; echo "jemalloc_build: dpkg-source -x failed" >&2; exit 1; }
cd src

# debian/rules' configure options for amd64, with Debian's build flags.
arch=$(dpkg-architecture -qDEB_HOST_ARCH)
if [ "$arch" != amd64 ]; then
  echo "jemalloc_build: only amd64's configuration is reproduced here (this is $arch)" >&2
  exit 1
fi
eval "$(DEB_BUILD_MAINT_OPTIONS= dpkg-buildflags --export=sh)"
config=(--with-version=VERSION --with-lg-page=12 --with-lg-hugepage=21 --enable-prof)
echo "configure ${config[*]}" >>"$log"
./configure "${config[@]}" >>"$log" 2>&1 || {
  tail -50 "$log" >&2; echo "jemalloc_build: configure failed" >&2; exit 1; }
make -j"$(nproc)" tests_integration >>"$log" 2>&1 || {
  tail -50 "$log" >&2; echo "jemalloc_build: make tests_integration failed" >&2; exit 1; }

# The programs jemalloc's 'make check_integration' runs, from its Makefile.
tests=$(make -s -f Makefile -f - print-rdmalloc-tests <<'EOF'
print-rdmalloc-tests:
	@echo $(TESTS_INTEGRATION:$(srcroot)%.c=%) $(TESTS_INTEGRATION_CPP:$(srcroot)%.cpp=%)
EOF
)
harness=$(make -s -f Makefile -f - print-rdmalloc-harness <<'EOF'
print-rdmalloc-harness:
	@echo $(C_TESTLIB_INTEGRATION_OBJS) $(C_UTIL_INTEGRATION_OBJS)
EOF
)
{
  echo "version=$version"
  echo "configure=${config[*]}"
  echo "cc=$(make -s -f Makefile -f - p <<<'p: ; @echo $(CC)')"
  echo "cxx=$(make -s -f Makefile -f - p <<<'p: ; @echo $(CXX)')"
  echo "ldflags=$(make -s -f Makefile -f - p <<<'p: ; @echo $(LDFLAGS)')"
  echo "c_libs=$(make -s -f Makefile -f - p <<<'p: ; @echo $(filter-out -lm,$(filter -lrt -pthread -lstdc++,$(LIBS))) $(LM)')"
  echo "cxx_libs=$(make -s -f Makefile -f - p <<<'p: ; @echo $(filter-out -lm,$(LIBS)) -lm')"
  echo "enable_fill=$(sed -n 's/^ *enable_fill=\([0-9]*\).*/\1/p' test/test.sh)"
  echo "enable_prof=$(sed -n 's/^ *enable_prof=\([0-9]*\).*/\1/p' test/test.sh)"
  echo "tests=$tests"
  echo "harness=$harness"
} > rdmalloc-build.env
cp "$log" build.log

files=(rdmalloc-build.env build.log lib/libjemalloc.so.2 include/jemalloc/jemalloc.h $harness)
for t in $tests; do
  files+=("$t.o")
  [ -e "$t.sh" ] && files+=("$t.sh")
done
tar -czf "$out" "${files[@]}"
echo "jemalloc_build: jemalloc $version, $(wc -w <<<"$tests") integration programs"
