#!/bin/bash
# Call 4: the norm kernel against Inductor's norms, interleaved in one process per shape; batch 8 auto.
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
COMMON="--context 1024 --rounds 30 --stage-rounds 0 --no-plots --variants compiled/16/splitkv,compiled/17/splitkv"
timeout 75 python3 .stage/tk/normab_bench.py bench --synthetic smollm2-135m $COMMON --batch-methods "1=none,dflash,ddtree:64,ddtree:256" --out $OUT/s2-normab.json 2>&1 | grep -v -i warn | grep -A30 "^kernel variants"
timeout 90 python3 .stage/tk/normab_bench.py bench --synthetic qwen3-8b $COMMON --batch-methods "1=none,ddtree:64" --out $OUT/q8-normab.json 2>&1 | grep -v -i warn | grep -A30 "^kernel variants"
timeout 80 python3 -m treeflash.cli bench --synthetic qwen3-8b --context 1024 --rounds 20 --stage-rounds 2 --no-plots --batch-methods "8=none,ddtree:64,ddtree:auto" --out $OUT/q8-b8.json 2>&1 | grep -v -i warn | grep -A12 "^qwen3-8b ("
