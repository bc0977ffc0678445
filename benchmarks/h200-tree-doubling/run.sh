#!/bin/bash
# Last minutes of device time: the tree builder's pruned extensions + pointer doubling, stage split on
# the synthetic SmolLM2 and Qwen3-8B shapes at batch 1 (compare with benchmarks/h200-defaults-after-merge).
export PYTHONUNBUFFERED=1 TQDM_DISABLE=1; mkdir -p $OUT/t
timeout 70 python3 -m treeflash.cli bench --synthetic smollm2-135m --context 1024 --batch-methods '1=none,ddtree:64' --rounds 10 --stage-rounds 3 --no-plots --out $OUT/t/smollm2.json > $OUT/t/smollm2.log 2>&1; echo "smol rc $?"
python3 -m treeflash.cli bench --replot $OUT/t/smollm2.json --no-plots 2>/dev/null | tail -8
timeout 110 python3 -m treeflash.cli bench --synthetic qwen3-8b --context 1024 --batch-methods '1=none,ddtree:64,ddtree:256' --rounds 5 --stage-rounds 2 --no-plots --out $OUT/t/qwen3-8b.json > $OUT/t/qwen3-8b.log 2>&1; echo "q8 rc $?"
python3 -m treeflash.cli bench --replot $OUT/t/qwen3-8b.json --no-plots 2>/dev/null | tail -8
