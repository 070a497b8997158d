#!/bin/bash
# run.py's statistics (doctests) and its report: the committed results must
# render into docs/BENCHMARKS.md as committed, so a change to the renderer
# that the document does not show fails here.
set -eu
run_py="$1" json="$2" doc="$3"
python3 -m doctest "$run_py"
out="$TEST_TMPDIR/docs"
mkdir -p "$out"
cp "$json" "$out/benchmarks.json"
python3 - "$run_py" "$out" <<'PY'
import importlib.util, json, os, sys
spec = importlib.util.spec_from_file_location("run", sys.argv[1])
run = importlib.util.module_from_spec(spec)
spec.loader.exec_module(run)
run.plot = lambda *args: None  # the picture needs gnuplot and is not compared
with open(os.path.join(sys.argv[2], "benchmarks.json")) as f:
    run.render(json.load(f), os.path.join(sys.argv[2], "BENCHMARKS.md"))
PY
if ! diff -u "$doc" "$out/BENCHMARKS.md"; then
  echo "docs/BENCHMARKS.md differs from what run.py renders of docs/benchmarks.json:" \
       "run benchmarks/run.py --render-only" >&2
  exit 1
fi
echo "run.py: doctests pass, docs/BENCHMARKS.md is what it renders"
