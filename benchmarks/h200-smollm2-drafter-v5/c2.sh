#!/bin/bash
# Call 2 as run: stage blob part 1, then (inline in the call's command) the synthetic Qwen3-8B bench of
# the automatic budget, whose results are in benchmarks/h200-auto-no-draft/.
test -f ~/stage/p00 || { echo "p00 missing: not warm"; exit 3; }
cp .stage/g5/p01 ~/stage/ && ls -la ~/stage
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1 TQDM_DISABLE=1 && mkdir -p $OUT/c2
timeout 250 python3 -m treeflash.cli bench --synthetic qwen3-8b --context 1024 --rounds 20 --stage-rounds 2 --no-plots \
  --batch-methods '1=none,ddtree:16,ddtree:64,ddtree:auto 8=none,ddtree:4,ddtree:16,ddtree:auto 32=none,ddtree:4,ddtree:8,ddtree:auto' \
  --out $OUT/c2/qwen3-8b-auto.json > $OUT/c2/qwen3-8b-auto.log 2>&1; echo "q8 rc $?"
python3 -m treeflash.cli bench --replot $OUT/c2/qwen3-8b-auto.json --no-plots 2>/dev/null | tail -14; date
