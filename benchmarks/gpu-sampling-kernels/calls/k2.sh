#!/bin/bash
# Call 2: the penalty kernel (treeflash/penalty_kernel.py). Section L: penalties, logit_bias and min_tokens
# graphed == eager == plain decoding (and transformers' repetition penalty), no host sync in replays, and the
# kernel against the torch ops bit for bit at vocabularies of 49,152 and 151,936; with timings, graphed rounds
# with penalties through the kernel and through the torch ops in the same process, and with repetition_penalty
# 1.05 alone (what a Qwen2.5 checkpoint's generation_config.json now sets on every request).
export PYTHONUNBUFFERED=1 TQDM_DISABLE=1 PYTHONPATH=$PWD
nvidia-smi -L; date; mkdir -p $OUT/k2
timeout -k 5 ${LIMIT:-420} python3 scripts/gpu_check.py --sections L --logprobs-timings smollm2-135m,qwen3-8b \
  --out $OUT/k2/gpu_check_l_timings.json > $OUT/k2/gpu_check_l_timings.log 2>&1
echo "L rc $?"; grep -a -E "FAILED|Error|all checks|false|graphed ms|penalty kernel" $OUT/k2/gpu_check_l_timings.log | head -30; date
