#!/bin/bash
# Call 1: the Triton tree builder against build_tree's torch ops at budgets past 64, per build and per round.
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
cd $PWD
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv | tee $OUT/gpu.txt
git log -1 --format=%H > $OUT/commit.txt 2>/dev/null
python3 -c "import treeflash.provenance as p; print(p.source_digest())" > $OUT/digest.txt 2>&1
timeout 150 python3 benchmarks/tree_kernel_ab.py --budgets 64,128,256,512 --slots 1,8 --vocab 16384 --out $OUT/tk16k.json 2>&1 | grep -v -i warn | tee $OUT/tk16k.log
timeout 100 python3 benchmarks/tree_kernel_ab.py --budgets 64,128,256 --slots 1 --vocab 151936 --out $OUT/tk152k.json 2>&1 | grep -v -i warn | tee $OUT/tk152k.log
V=compiled/16/splitkv/treekernel,compiled/16/splitkv/treeops
timeout 170 python3 -m treeflash.cli bench --synthetic qwen3-8b --context 1024 --rounds 20 --stage-rounds 2 --no-plots \
  --batch-methods "1=none,ddtree:64,ddtree:128,ddtree:256 8=none,ddtree:64,ddtree:128" --variants $V --out $OUT/q8.json 2>&1 | grep -v -i warn | tail -30
timeout 100 python3 -m treeflash.cli bench --synthetic smollm2-135m --context 1024 --rounds 30 --stage-rounds 2 --no-plots \
  --batch-methods "1=none,dflash,ddtree:64,ddtree:128,ddtree:256 8=none,ddtree:64,ddtree:128" --variants $V --out $OUT/s2.json 2>&1 | grep -v -i warn | tail -30
