#!/bin/bash
# The merge kernel's tile: one call per shape point, then whole Qwen3-8B rounds at tiles 2048, 4096 and main's 8192.
export PYTHONPATH=$PWD TQDM_DISABLE=1 PYTHONUNBUFFERED=1
timeout 80 python3 .stage/skv/tiles_ab.py 2>&1 | grep -v Warn
B=(-m treeflash.cli bench --context 1024 --rounds 20 --stage-rounds 3 --no-plots --synthetic qwen3-8b
   --variants compiled/16/hybrid --batch-methods "1=none,ddtree:32,ddtree:64 8=ddtree:16")
for tile in 2048 8192 4096; do
  timeout 85 python3 .stage/skv/merge_tile.py $tile "${B[@]}" --out $OUT/q8-tile-$tile.json 2>&1 | grep -E "^ +[0-9]+ " | head -4
done
