#!/usr/bin/env bash
# Interleaved on this 2-core CPU: the tree before the change (OLD, a worktree of b176cba), this one, and
# plain decoding, twice each, one process per run.
#   git worktree add /tmp/oldtree b176cba && bash benchmarks/cpu-auto-no-draft/ab.sh /tmp/oldtree
set -euo pipefail
OLD=$1
R=benchmarks/cpu-auto-no-draft
PY=.venv/bin/python
for run in 1 2; do
  PYTHONPATH=$OLD $PY $R/batch8.py --out $R/batch8-old-$run.json
  PYTHONPATH=. $PY $R/batch8.py --out $R/batch8-new-$run.json
  PYTHONPATH=. $PY $R/batch8.py none --out $R/batch8-none-$run.json
done
