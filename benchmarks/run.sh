#!/bin/bash
# One command for all benchmark numbers: installs what they need, builds
# optimised, runs everything side by side, writes docs/BENCHMARKS.md and
# docs/benchmarks.png. Arguments go to benchmarks/run.py (e.g. --rounds 3).
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/setup.sh >/dev/null
exec python3 benchmarks/run.py "$@"
