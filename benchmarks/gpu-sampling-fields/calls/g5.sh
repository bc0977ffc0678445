#!/bin/bash
# Call 5: after penalize broadcasts a past without paths (no [S, N, V] copy) and the fallback runs only with a bias row:
# gpu_check L and F with the graphed-round timings.
export PYTHONUNBUFFERED=1 TQDM_DISABLE=1 PYTHONPATH=$PWD
nvidia-smi -L; date; mkdir -p $OUT/g5
timeout -k 5 ${LIMIT:-560} python3 scripts/gpu_check.py --sections LF --logprobs-timings smollm2-135m,qwen3-8b \
  --out $OUT/g5/gpu_check_lf_timings.json > $OUT/g5/gpu_check_lf_timings.log 2>&1
echo "LF rc $?"; grep -a -E "FAILED|rror|all checks|false|graphed ms|log_softmax_rows" $OUT/g5/gpu_check_lf_timings.log | head -20; date
