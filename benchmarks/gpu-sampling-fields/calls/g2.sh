#!/bin/bash
# Call 2: gpu_check L again with its graphed-round timings (bf16 random weights at the two shapes).
export PYTHONUNBUFFERED=1 TQDM_DISABLE=1 PYTHONPATH=$PWD
nvidia-smi -L; date; mkdir -p $OUT/g2
timeout -k 5 ${LIMIT:-560} python3 scripts/gpu_check.py --sections L --logprobs-timings smollm2-135m,qwen3-8b \
  --out $OUT/g2/gpu_check_l_timings.json > $OUT/g2/gpu_check_l_timings.log 2>&1
echo "L rc $?"; grep -a -E "FAILED|rror|all checks|false|graphed ms" $OUT/g2/gpu_check_l_timings.log | head -20; date
