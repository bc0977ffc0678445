#!/usr/bin/env bash
# Interleaved on this 2-core CPU: the tree before the change (BASE, a worktree), this one and plain decoding,
# RUNS times each, one process per run, through benchmarks/cpu-auto-no-draft/batch8.py (48 chat requests
# at 8 slots, half greedy, half seeded).
#   git worktree add /tmp/basetree fdcb2f3 && bash benchmarks/cpu-explore-backoff/ab.sh /tmp/basetree
set -euo pipefail
BASE=$1
R=benchmarks/cpu-explore-backoff
PY=.venv/bin/python
for run in $(seq 1 ${RUNS:-2}); do
  PYTHONPATH=$BASE $PY benchmarks/cpu-auto-no-draft/batch8.py --out $R/batch8-base-$run.json
  PYTHONPATH=. $PY benchmarks/cpu-auto-no-draft/batch8.py --out $R/batch8-new-$run.json
  PYTHONPATH=. $PY benchmarks/cpu-auto-no-draft/batch8.py none --out $R/batch8-none-$run.json
done
