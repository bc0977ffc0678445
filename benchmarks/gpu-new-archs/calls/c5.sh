#!/bin/bash
# Call 5 (the session's last 333 s of device time): section A for the three new tiny targets alone, greedy equal to
# transformers' in float32 on CUDA (c1's Gemma 3 run was cut before A).
export PYTHONPATH=$PWD TQDM_DISABLE=1 PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
timeout 150 python3 scripts/gpu_check.py --sections A --parity-targets gemma3,phi3,smollm3 \
  --out $OUT/gpu_check_parity.json > $OUT/parity.log 2>&1; echo "A rc $?"
grep -a -A6 '"A\. ' $OUT/parity.log | head -8
