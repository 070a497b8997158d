#!/bin/bash
# The Python suites driver can fail: on a stand-in suite (selftest/) whose
# cases misbehave only under rdmalloc, it must report a hang (naming the
# suite and the case) and a difference, and fail; accept a difference that
# the expectations explain; and fail on an expectation that no longer holds.
#
#   python_suites_selftest.sh DRIVER LIBRDMALLOC SELFTEST_DIR/test_rdm_selftest.py
set -u
driver=$1 lib=$2 dir=$(dirname "$3")
tmp=$(mktemp -d "${TEST_TMPDIR:-/tmp}/selftest.XXXXXX")
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
run() {  # name expectations-file mode
  # Its own test.xml and logs elsewhere: this test's test.xml is Bazel's.
  mkdir -p "$tmp/$1.logs"
  env -u XML_OUTPUT_FILE TEST_UNDECLARED_OUTPUTS_DIR="$tmp/$1.logs" \
    SELFTEST_MODE=$3 "$driver" --rdmalloc "$lib" --expectations "$2" --testdir "$dir" \
    --suites test_rdm_selftest --suite-timeout 10 --jobs 3 --no-gdb >"$tmp/$1.out" 2>&1
  echo $?
}
expect() {  # name pattern
  grep -qF -- "$2" "$tmp/$1.out" || { fail "$1: output lacks: $2"; sed 's/^/    /' "$tmp/$1.out"; }
}

: >"$tmp/none.ini"
cat >"$tmp/differs.ini" <<'EOF'
[python test_rdm_selftest.SelfTest.test_b_differs]
rdmalloc = fail
reason = the stand-in case fails only under rdmalloc, on purpose
EOF

# 1. A hang in a forked child and a failing case: both reported, exit 1, and
#    the case after the hang still runs (the suite is re-run without it).
rc=$(run hang "$tmp/none.ini" hang,differ)
[ "$rc" = 1 ] || fail "hang: exit $rc, not 1"
expect hang "HANG: test_rdm_selftest under rdmalloc: no progress for 10 s in test_rdm_selftest.SelfTest.test_c_hangs_in_fork"
expect hang "rdmalloc HANGS in test_rdm_selftest.SelfTest.test_c_hangs_in_fork"
expect hang "test_rdm_selftest.SelfTest.test_b_differs: jemalloc pass, rdmalloc fail (re-run alone: fail, fail)"
expect hang "FAIL: test_rdm_selftest: rdmalloc differs from stock jemalloc"
grep -E "^  done: test_rdm_selftest +rdmalloc +5 cases +2 pass +1 fail +1 skip" "$tmp/hang.out" >/dev/null ||
  fail "hang: rdmalloc's counts are not 5 cases, 2 pass (a, d after the re-run), 1 fail, 1 skip"

# 2. The same difference, explained: exit 0, reported as expected.
rc=$(run expected "$tmp/differs.ini" differ)
[ "$rc" = 0 ] || { fail "expected: exit $rc, not 0"; sed 's/^/    /' "$tmp/expected.out"; }
expect expected "expected: test_rdm_selftest.SelfTest.test_b_differs: rdmalloc fail"

# 3. The explanation without the difference: stale, exit 1.
rc=$(run stale "$tmp/differs.ini" "")
[ "$rc" = 1 ] || fail "stale: exit $rc, not 1"
expect stale "stale expectation [python test_rdm_selftest.SelfTest.test_b_differs]"

if [ "$failures" -ne 0 ]; then
  echo "$failures check(s) failed"
  exit 1
fi
echo "the driver reports hangs and differences, accepts explained ones, refuses stale ones"
