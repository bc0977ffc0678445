#!/bin/bash
# Call 1: SmolLM3 and Phi-3 on CUDA. gpu_check A (every tiny target, SmolLM3's NoPE layer with a window and Phi-3's
# fused projections, half-rotated heads and LongRoPE among them: greedy == transformers on the GPU, float32), B E F
# on the tiny Phi-3 and E F on the tiny SmolLM3 through the sdpa and splitkv attentions (CUDA graphs == eager,
# speculative greedy == plain, no host sync in replays); then the SmolLM3-3B and Phi-4-mini shapes' rounds
# (random bf16 weights, CUDA graphs, compiled kernels: the NoPE tables and the half-rotated scale in bfloat16).
export PYTHONPATH=$PWD TQDM_DISABLE=1 PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
timeout 230 python3 scripts/gpu_check.py --sections ABEF --target phi3 --attentions sdpa,splitkv \
  --out $OUT/gpu_check_phi3.json > $OUT/phi3.log 2>&1; echo "ABEF phi3 rc $?"; tail -1 $OUT/phi3.log
timeout 150 python3 scripts/gpu_check.py --sections EF --target smollm3 --attentions sdpa,splitkv \
  --out $OUT/gpu_check_smollm3.json > $OUT/smollm3.log 2>&1; echo "EF smollm3 rc $?"; tail -1 $OUT/smollm3.log
for shape in smollm3-3b phi4-mini; do
  timeout 90 python3 -m treeflash.cli bench --synthetic $shape --context 1024 --rounds 20 --stage-rounds 2 \
    --no-plots --batch-methods "1=none,dflash,ddtree:16,ddtree:64" --out $OUT/$shape.json \
    > $OUT/$shape.txt 2>&1; echo "$shape rc $?"; grep -aE "^ +[0-9]+ |floor|rror" $OUT/$shape.txt | head -12
done
