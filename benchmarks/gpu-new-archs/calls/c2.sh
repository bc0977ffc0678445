#!/bin/bash
# Call 2 (what the session's device time left room for, if c1.sh cannot run): the riskiest part alone, Gemma 3
# on CUDA: gpu_check A (every tiny target), B E F on the tiny Gemma 3 through splitkv, and the Gemma 3 1B
# shape's rounds through splitkv (heads of 256) and sdpa.
export PYTHONPATH=$PWD TQDM_DISABLE=1 PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
timeout 180 python3 scripts/gpu_check.py --sections ABEF --target gemma3 --attentions splitkv \
  --out $OUT/gpu_check_gemma3.json > $OUT/checks.log 2>&1; echo "ABEF gemma3 rc $?"
grep -a "checks passed\|FAIL\|Error" $OUT/checks.log | head
timeout 90 python3 -m treeflash.cli bench --synthetic gemma3-1b --context 1024 --rounds 20 --stage-rounds 2 \
  --variants compiled/16/splitkv,compiled/16/sdpa --no-plots --batch-methods "1=none,dflash,ddtree:16,ddtree:64" \
  --out $OUT/gemma3-1b.json > $OUT/bench.log 2>&1; echo "gemma3-1b rc $?"
grep -aE "^ +[0-9]+ |floor|rror" $OUT/bench.log | head -30
