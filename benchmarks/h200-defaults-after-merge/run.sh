#!/bin/bash
# Call F (last ~4 min of device time): the merged defaults (fused kernels, decoding kernel <= 16 tokens / 64 rows).
export PYTHONUNBUFFERED=1 TQDM_DISABLE=1; mkdir -p $OUT/f
timeout 100 python3 -m treeflash.cli bench --synthetic smollm2-135m --context 1024 --batch-methods '1=none,ddtree:16,ddtree:64' --variants compiled/16,eager/16 --rounds 10 --stage-rounds 2 --no-plots --out $OUT/f/smollm2.json > $OUT/f/smollm2.log 2>&1; echo "smol rc $?"
python3 -m treeflash.cli bench --replot $OUT/f/smollm2.json --no-plots 2>/dev/null
timeout 100 python3 -m treeflash.cli bench --synthetic qwen3-8b --context 1024 --batch-methods '1=none,ddtree:64 8=none,ddtree:4,ddtree:8,ddtree:16,ddtree:auto 1=ddtree:16' --rounds 5 --stage-rounds 0 --no-plots --out $OUT/f/qwen3-8b.json > $OUT/f/qwen3-8b.log 2>&1; echo "q8 rc $?"
python3 -m treeflash.cli bench --replot $OUT/f/qwen3-8b.json --no-plots 2>/dev/null
