#!/bin/bash
# Call 2: whole Qwen3-8B-shape rounds, q/k norms as two compiled pieces (main) then as one reduction (this branch).
export PYTHONPATH=$PWD TQDM_DISABLE=1 PYTHONUNBUFFERED=1
B="-m treeflash.cli bench --context 1024 --rounds 20 --stage-rounds 3 --no-plots --synthetic qwen3-8b
 --variants compiled/16/hybrid --batch-methods 1=none,ddtree:64,ddtree:256"
for i in 1 2; do
  timeout 140 python3 .stage/fm/twopiece.py $B --out $OUT/q8-two-$i.json 2>&1 | grep -v Warn | head -5 | tee $OUT/q8-two-$i.txt
  timeout 140 python3 $B --out $OUT/q8-one-$i.json 2>&1 | grep -v Warn | head -5 | tee $OUT/q8-one-$i.txt
done
