#!/bin/bash
# Call 1: gpu_check L (log-probs, penalties, logit_bias, min_tokens, and now allowed_token_ids, bad_words and
# prompt log-probs), E (graphed == eager, prefill included) and F (no host sync), float32 tiny models.
export PYTHONUNBUFFERED=1 TQDM_DISABLE=1 PYTHONPATH=$PWD
nvidia-smi -L; date; mkdir -p $OUT/g1
timeout -k 5 ${LIMIT:-540} python3 scripts/gpu_check.py --sections LEF \
  --out $OUT/g1/gpu_check_lef.json > $OUT/g1/gpu_check_lef.log 2>&1
echo "LEF rc $?"; grep -a -E "FAILED|rror|all checks|false" $OUT/g1/gpu_check_lef.log | head -20; date
