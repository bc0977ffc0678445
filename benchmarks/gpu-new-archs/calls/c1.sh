#!/bin/bash
# Call 1: SmolLM3, Phi-3 and Gemma 3 on CUDA. gpu_check A (every tiny target, among them SmolLM3's NoPE layer with
# a window, Phi-3's fused projections, half-rotated heads and LongRoPE, Gemma 3's (1 + w) sandwich norms, scaled
# embedding and local RoPE: greedy == transformers on the GPU, float32), B E F on the tiny Gemma 3 and E F on the
# tiny Phi-3 and SmolLM3, through the sdpa and splitkv attentions (CUDA graphs == eager, speculative greedy ==
# plain, no host sync in replays); then the Gemma 3 1B (heads of 256), SmolLM3-3B and Phi-4-mini shapes' rounds
# (random bf16 weights, CUDA graphs, compiled kernels). Eight files come back: three checks' JSONs, their log,
# three benches' JSONs, their log.
export PYTHONPATH=$PWD TQDM_DISABLE=1 PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
timeout 200 python3 scripts/gpu_check.py --sections ABEF --target gemma3 --attentions sdpa,splitkv \
  --out $OUT/gpu_check_gemma3.json >> $OUT/checks.log 2>&1; echo "ABEF gemma3 rc $?"
for t in phi3 smollm3; do
  timeout 90 python3 scripts/gpu_check.py --sections EF --target $t --attentions splitkv \
    --out $OUT/gpu_check_$t.json >> $OUT/checks.log 2>&1; echo "EF $t rc $?"
done
grep -a "checks passed\|FAIL\|Error" $OUT/checks.log | head
# (Gemma 3's heads of 256 default to sdpa until splitkv has run at that width: both, on the same weights)
for shape in gemma3-1b smollm3-3b phi4-mini; do
  echo "== $shape" >> $OUT/bench.log
  variants=$([ $shape = gemma3-1b ] && echo "--variants compiled/16/splitkv,compiled/16/sdpa")
  timeout 60 python3 -m treeflash.cli bench --synthetic $shape --context 1024 --rounds 20 --stage-rounds 2 $variants \
    --no-plots --batch-methods "1=none,dflash,ddtree:16,ddtree:64" --out $OUT/$shape.json \
    >> $OUT/bench.log 2>&1; echo "$shape rc $?"
done
grep -aE "^== |^ +[0-9]+ |floor|rror" $OUT/bench.log | head -40
