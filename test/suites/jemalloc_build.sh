#!/bin/bash
# Builds jemalloc's integration tests from Debian's source package, unpatched
# and configured the way Debian builds libjemalloc2 on amd64
# (third_party/jemalloc_source.sh), and packs what the
# test needs into one tarball: the fresh libjemalloc.so.2, every integration
# program's object file and .sh, the harness objects, the link flags and the
# list of programs from the Makefile. //test/suites:jemalloc_integration_test
# links the programs twice (against that library and against librdmalloc.so)
# and compares them. Nothing of jemalloc is committed: the source comes from
# apt-get source (tools/setup.sh adds the deb-src entries).
#
#   jemalloc_build.sh OUT.tar.gz JEMALLOC_SOURCE_SH
set -euo pipefail
out=$(realpath -m "$1")
source_script=$(realpath "$2")
work=$(mktemp -d /tmp/rdm-jemalloc-build.XXXXXX)
trap 'rm -rf "$work"' EXIT
log=$work/build.log
"$source_script" "$work"
version=$(cat "$work/version")
config=($(cat "$work/configure"))
cd "$work/src"
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
