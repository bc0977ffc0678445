#!/bin/bash
# Call 3 (after c1.sh, whose 200 s for Gemma 3's checks and 60 s a bench were too few for the compiles): Gemma 3
# alone on what device time was left: gpu_check B E F on the tiny Gemma 3 through splitkv and sdpa (A, every tiny
# target against transformers, ran in c1 up to Gemma 3's turn), then the Gemma 3 1B shape's AR step and DDTree-16
# round through splitkv (heads of 256) and sdpa.
export PYTHONPATH=$PWD TQDM_DISABLE=1 PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
timeout 230 python3 scripts/gpu_check.py --sections BEF --target gemma3 --attentions splitkv,sdpa \
  --out $OUT/gpu_check_gemma3.json > $OUT/checks.log 2>&1; echo "BEF gemma3 rc $?"
grep -a "checks passed\|FAIL\|Error\|false" $OUT/checks.log | head
timeout 150 python3 -m treeflash.cli bench --synthetic gemma3-1b --context 1024 --rounds 20 --stage-rounds 2 \
  --variants compiled/16/splitkv,compiled/16/sdpa --no-plots --batch-methods "1=none,ddtree:16" \
  --out $OUT/gemma3-1b.json > $OUT/bench.log 2>&1; echo "gemma3-1b rc $?"
grep -aE "per round|floor|rror" $OUT/bench.log | head -30
