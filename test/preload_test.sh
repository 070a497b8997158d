#!/bin/bash
# Real programs under LD_PRELOAD=librdmalloc.so: their output must equal the
# output without rdmalloc, and their exit report must show registered regions.
set -u
lib="$(cd "$(dirname "$1")" && pwd)/$(basename "$1")"
workload="$2"
tmp="${TEST_TMPDIR:-$(mktemp -d)}"
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }

# The report is one JSON object per process; check the last one.
check_report() {  # name report-file
  python3 - "$1" "$2" <<'PY' || fail "$1: report"
import json, sys
name, path = sys.argv[1], sys.argv[2]
lines = [l for l in open(path) if l.startswith("{")]
assert lines, f"{name}: no report"
r = json.loads(lines[-1])
print(f"{name}: backend={r['backend']} regions_live={r['regions_live']} "
      f"registered={r['bytes_registered'] >> 20} MiB reg_calls={r['reg_calls']} lookups={r['lookups']}")
assert r["regions_live"] > 0, "no regions"
assert r["bytes_registered"] > 0, "nothing registered"
assert r["reg_calls"] > 0 and r["reg_failures"] == 0
PY
}

run() {  # name report-file command...
  local name="$1" report="$2"; shift 2
  RDMALLOC_STATS=json RDMALLOC_STATS_FILE="$report" LD_PRELOAD="$lib" "$@"
}

# 1. python3: a real workload, then RDMA-style lookups and transfers via ctypes.
expected=$(python3 "$workload")
got=$(run python "$tmp/python.json" python3 "$workload" --rdma 2>"$tmp/python.err") || fail "python exited $?"
cat "$tmp/python.err"
[ "$got" == "$expected" ] || fail "python output differs under rdmalloc"
grep -q "buffers_checked=4" "$tmp/python.err" || fail "python rdma checks did not run"
check_report python "$tmp/python.json"

# 2. sort: 300k shuffled numbers; eager registration pins every region it makes.
seq 1 300000 | shuf --random-source=<(yes) > "$tmp/numbers"
got=$(RDMALLOC_REGISTER=eager run sort "$tmp/sort.json" sort -n "$tmp/numbers" | md5sum)
[ "$got" == "$(seq 1 300000 | md5sum)" ] || fail "sort output differs under rdmalloc"
check_report sort "$tmp/sort.json"

# 3. sqlite3: build, index and query a table in memory.
sql="create table t(a integer, b text); with recursive c(x) as (select 1 union all select x+1 from c where x < 200000) insert into t select x, hex(randomblob(16)) from c; create index i on t(b); select count(*), sum(a), count(distinct b) from t;"
expected=$(sqlite3 :memory: "$sql" | cut -d'|' -f1,2)
got=$(RDMALLOC_REGISTER=eager run sqlite3 "$tmp/sqlite.json" sqlite3 :memory: "$sql" | cut -d'|' -f1,2)
[ "$got" == "$expected" ] && [ "$got" == "200000|20000100000" ] || fail "sqlite3 output differs: $got"
check_report sqlite3 "$tmp/sqlite.json"

if [ "$failures" -ne 0 ]; then
  echo "$failures check(s) failed"
  exit 1
fi
echo "all preload checks passed"
