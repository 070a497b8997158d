#!/bin/bash
# rdmalloc-run end to end, and every RDMALLOC_* variable in real processes:
# a good value is silent, a bad one gives exactly one line on stderr naming
# the variable, and the program runs on with its normal output.
set -uo pipefail
run="$1"
tmp="${TEST_TMPDIR:-$(mktemp -d)}"
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }

help=$("$run" --help) || fail "--help exit status"
grep -q '^usage: rdmalloc-run' <<<"$help" || fail "--help"
"$run" --bogus -- /bin/true 2>/dev/null; [ $? -eq 2 ] || fail "unknown option must exit 2"
"$run" --bogus=1 -- /bin/true 2>/dev/null; [ $? -eq 2 ] || fail "unknown setting must exit 2"
# --help lists every setting (from allocator/options.h) as --name=VALUE, and
# the launcher takes each of them: it sets the variable, whatever the value.
flags=$(sed -n 's/^  --\([a-z-]*\)=.*  (\(RDMALLOC_[A-Z_]*\))$/\1 \2/p' <<<"$help")
[ "$(wc -l <<<"$flags")" -ge 12 ] || fail "--help lists $(wc -l <<<"$flags") settings: $help"
while read -r flag var; do
  out=$("$run" --stats=0 "--$flag=$tmp/a=b" -- printenv "$var" 2>/dev/null)
  [ "$out" == "$tmp/a=b" ] || fail "--$flag=$tmp/a=b set $var to '$out'"
done <<<"$flags"

out=$("$run" -- python3 -c 'print(sum(range(10)))' 2>"$tmp/err")
[ "$out" == "45" ] || fail "program output under rdmalloc-run: $out"
grep -q '^rdmalloc report' "$tmp/err" || fail "no text report"
grep -q 'no RDMA device found: pinning through io_uring' "$tmp/err" || fail "report does not say io_uring plainly"
cat "$tmp/err"

"$run" --stats=json -- python3 -c 'x = bytearray(1 << 22)' 2>"$tmp/json" || fail "json run"
python3 - "$tmp/json" <<'PY' || fail "json report does not parse"
import json, sys
r = json.loads(open(sys.argv[1]).read())
for key in ("backend", "device", "regions_live", "bytes_registered", "reg_calls", "lookups", "domains"):
    assert key in r, key
assert r["regions_live"] > 0
PY
rm -f "$tmp/report"
"$run" --stats=json --stats-file="$tmp/report" -- /bin/true 2>"$tmp/err2" || fail "stats-file run"
[ -s "$tmp/err2" ] && fail "report went to stderr despite --stats-file"
python3 -c 'import json,sys; json.loads(open(sys.argv[1]).read())' "$tmp/report" || fail "stats file"

# Every variable: good values silent, bad values one line, output intact.
check() {  # expect(0|1) VAR VALUE
  local expect="$1" var="$2" value="$3" out lines
  out=$(env "$var=$value" "$run" --stats=0 -- /bin/echo still-running 2>"$tmp/e")
  [ "$out" == "still-running" ] || fail "$var=$value: program output '$out'"
  lines=$(grep -c . "$tmp/e")
  if [ "$expect" == 0 ]; then
    [ "$lines" -eq 0 ] || fail "$var=$value should be silent: $(cat "$tmp/e")"
  else
    [ "$lines" -eq 1 ] || fail "$var=$value: expected one line, got $lines: $(cat "$tmp/e")"
    grep -q "$var" "$tmp/e" || fail "$var=$value: line does not name the variable"
  fi
}
check 0 RDMALLOC_BACKEND uring;         check 1 RDMALLOC_BACKEND rdma
check 0 RDMALLOC_BACKEND auto;          check 1 RDMALLOC_BACKEND ''
check 0 RDMALLOC_DEVICE mlx5_0;         check 1 RDMALLOC_DEVICE "$(printf 'd%.0s' {1..80})"
check 0 RDMALLOC_REGION_SIZE 64M;       check 1 RDMALLOC_REGION_SIZE 1K
check 0 RDMALLOC_REGISTER eager;        check 1 RDMALLOC_REGISTER sometimes
check 0 RDMALLOC_ACCESS local_write;    check 1 RDMALLOC_ACCESS remote_everything
check 0 RDMALLOC_MAX_PINNED 256M;       check 1 RDMALLOC_MAX_PINNED -5
check 0 RDMALLOC_DECAY_MS 100;          check 1 RDMALLOC_DECAY_MS soon
check 1 RDMALLOC_STATS_FILE ''
# A report file with the report on: silent on stderr, the report in the file.
out=$(RDMALLOC_STATS_FILE="$tmp/sf" "$run" -- /bin/echo still-running 2>"$tmp/e")
[ "$out" == "still-running" ] && [ ! -s "$tmp/e" ] && grep -q '^rdmalloc report' "$tmp/sf" || fail "RDMALLOC_STATS_FILE good value"
# With RDMALLOC_STATS=0 explicitly, a report file is a contradiction: one line.
check 1 RDMALLOC_STATS_FILE "$tmp/sf"
check 0 RDMALLOC_VERBS_LIBRARY /nonexistent/libibverbs.so.1
check 1 RDMALLOC_VERBS_LIBRARY ''
check 0 RDMALLOC_VERBOSE 0;             check 1 RDMALLOC_VERBOSE loud
check 0 RDMALLOC_NOTIFY libfabric;      check 1 RDMALLOC_NOTIFY mpi
check 1 RDMALLOC_REGION_SIZ 64M  # a typo
# RDMALLOC_STATS itself: a bad value warns, and --stats=0 must not hide that.
out=$(RDMALLOC_STATS=often "$run" -- /bin/echo still-running 2>"$tmp/e")
[ "$out" == "still-running" ] && [ "$(grep -c 'RDMALLOC_STATS' "$tmp/e")" -eq 1 ] || fail "RDMALLOC_STATS=often: $(cat "$tmp/e")"
# A contradiction: one line, and the run goes on.
out=$(RDMALLOC_BACKEND=uring RDMALLOC_DEVICE=mlx5_0 "$run" --stats=0 -- /bin/echo still-running 2>"$tmp/e")
[ "$out" == "still-running" ] && [ "$(grep -c . "$tmp/e")" -eq 1 ] && grep -q contradicts "$tmp/e" || fail "contradiction: $(cat "$tmp/e")"

if [ "$failures" -ne 0 ]; then echo "$failures check(s) failed"; exit 1; fi
echo "launcher checks passed"
