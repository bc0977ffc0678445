#!/bin/bash
# Call 3: after the bad-word pasts became one product over the verify mask (and the AR round skips it):
# gpu_check L with its graphed-round timings, and F.
export PYTHONUNBUFFERED=1 TQDM_DISABLE=1 PYTHONPATH=$PWD
nvidia-smi -L; date; mkdir -p $OUT/g3
timeout -k 5 ${LIMIT:-560} python3 scripts/gpu_check.py --sections LF --logprobs-timings smollm2-135m,qwen3-8b \
  --out $OUT/g3/gpu_check_lf_timings.json > $OUT/g3/gpu_check_lf_timings.log 2>&1
echo "LF rc $?"; grep -a -E "FAILED|rror|all checks|false|graphed ms" $OUT/g3/gpu_check_lf_timings.log | head -20; date
