#!/bin/bash
# Qwen3-8B-shape rounds, main's launch_for then MANY_ROWS_WIDE_HEADS at one program per SM, twice, interleaved.
export PYTHONPATH=$PWD TQDM_DISABLE=1 PYTHONUNBUFFERED=1
B=(-m treeflash.cli bench --context 1024 --rounds 20 --stage-rounds 3 --no-plots --synthetic qwen3-8b
   --variants compiled/16/hybrid --batch-methods "1=none,ddtree:32,ddtree:64 8=ddtree:16")
for i in 1 2; do
  timeout 120 python3 -m treeflash.cli "${B[@]:2}" --out $OUT/q8-p2-$i.json 2>&1 | grep -E "^ +[0-9]+ " | head -4
  timeout 120 python3 .stage/skv/one_per_sm.py "${B[@]}" --out $OUT/q8-p1-$i.json 2>&1 | grep -E "^ +[0-9]+ " | head -4
done
