#!/bin/bash
# Call 2 (call 1 never got a machine; little device time was left): gpu_check A (tiny Mistral with an 8-token
# window and tiny GPT-OSS among the others: greedy == transformers on the GPU), B (GPT-OSS: dflash / ddtree
# greedy == plain, seeded samples), E (GPT-OSS, splitkv: CUDA graphs == eager, speculative greedy == plain) and
# F (no host sync in replayed GPT-OSS rounds).
export PYTHONPATH=$PWD TQDM_DISABLE=1 PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
timeout 130 python3 scripts/gpu_check.py --sections ABEF --target gpt_oss --attentions splitkv \
  --out $OUT/gpu_check_gpt_oss.json > $OUT/gpt_oss.log 2>&1; echo "ABEF gpt_oss rc $?"; tail -1 $OUT/gpt_oss.log
