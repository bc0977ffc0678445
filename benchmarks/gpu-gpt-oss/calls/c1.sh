#!/bin/bash
# Call 1: sliding windows and GPT-OSS on CUDA. gpu_check A (tiny Mistral with an 8-token window and tiny GPT-OSS
# among the others: greedy == transformers on the GPU), B (GPT-OSS: dflash / ddtree greedy == plain, seeded
# samples), E (GPT-OSS, splitkv: CUDA graphs == eager, speculative greedy == plain) and F (no host sync in
# replayed GPT-OSS rounds); E on the tiny Mistral; then the GPT-OSS-20B shape's rounds (random bf16 weights).
export PYTHONPATH=$PWD TQDM_DISABLE=1 PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
timeout 100 python3 scripts/gpu_check.py --sections ABEF --target gpt_oss --attentions splitkv \
  --out $OUT/gpu_check_gpt_oss.json > $OUT/gpt_oss.log 2>&1; echo "ABEF gpt_oss rc $?"; tail -1 $OUT/gpt_oss.log
timeout 150 python3 -m treeflash.cli bench --synthetic gpt-oss-20b --context 1024 --rounds 20 --stage-rounds 2 \
  --no-plots --batch-methods "1=none,dflash,ddtree:16,ddtree:64" --out $OUT/oss20b.json \
  > $OUT/oss20b.txt 2>&1; echo "bench rc $?"; grep -aE "^ +[0-9]+ |floor|rror" $OUT/oss20b.txt | head -20
timeout 50 python3 scripts/gpu_check.py --sections E --target mistral --attentions splitkv \
  --out $OUT/gpu_check_e_mistral.json > $OUT/e_mistral.log 2>&1; echo "E mistral rc $?"; tail -1 $OUT/e_mistral.log
