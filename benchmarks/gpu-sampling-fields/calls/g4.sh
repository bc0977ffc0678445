#!/bin/bash
# Call 4: after drafts take the requests' bias row, penalties and min_tokens (27e6fae) and the drafts'
# log-softmax kernel takes rows masked in whole pieces: gpu_check L (with that kernel's check) and F, with
# L's graphed-round timings.
export PYTHONUNBUFFERED=1 TQDM_DISABLE=1 PYTHONPATH=$PWD
nvidia-smi -L; date; mkdir -p $OUT/g4
timeout -k 5 ${LIMIT:-560} python3 scripts/gpu_check.py --sections LF --logprobs-timings smollm2-135m,qwen3-8b \
  --out $OUT/g4/gpu_check_lf_timings.json > $OUT/g4/gpu_check_lf_timings.log 2>&1
echo "LF rc $?"; grep -a -E "FAILED|rror|all checks|false|graphed ms|log_softmax_rows" $OUT/g4/gpu_check_lf_timings.log | head -20; date
