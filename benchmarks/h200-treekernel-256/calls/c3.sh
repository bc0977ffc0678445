#!/bin/bash
# Call 3: checks and rounds at the final code (tree kernel to budget 256 with its warps, the norm kernel).
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
python3 -c "import treeflash.provenance as p; print(p.source_digest())" > $OUT/digest.txt 2>&1
timeout 150 python3 scripts/gpu_check.py --sections E --attentions splitkv --out $OUT/gpu_check_e.json 2>&1 | grep -v -i warn | tail -25
Q="1=none,dflash,ddtree:64,ddtree:128,ddtree:256"
COMMON="--context 1024 --rounds 20 --stage-rounds 2 --no-plots"
timeout 130 python3 -m treeflash.cli bench --synthetic qwen3-8b $COMMON --batch-methods "$Q 8=none,ddtree:64,ddtree:auto" --out $OUT/q8.json 2>&1 | grep -v -i warn | grep -A30 "^qwen3-8b ("
timeout 90 python3 .stage/tk/nonorm.py bench --synthetic qwen3-8b $COMMON --batch-methods "$Q" --out $OUT/q8-inductor-norms.json 2>&1 | grep -v -i warn | grep -A30 "^qwen3-8b ("
timeout 70 python3 -m treeflash.cli bench --synthetic smollm2-135m $COMMON --batch-methods "$Q 8=none,ddtree:64" --variants compiled/16/splitkv,compiled/16/splitkv/treeops --out $OUT/s2.json 2>&1 | grep -v -i warn | grep -A40 "^smollm2-135m ("
timeout 50 python3 .stage/tk/nonorm.py bench --synthetic smollm2-135m $COMMON --batch-methods "$Q" --out $OUT/s2-inductor-norms.json 2>&1 | grep -v -i warn | grep -A30 "^smollm2-135m ("
