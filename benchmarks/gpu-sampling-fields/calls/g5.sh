#!/bin/bash
# Call 5: first gpu_check S (structured outputs, now with their rounds and prefills replayed as CUDA graphs:
# tokens equal to eager and to plain decoding, the table grown mid-run, no host sync in a round or replay);
# then L and F with L's timings after `penalize` broadcasts a shared past (87135b4), which now also time
# penalties and allowed tokens with blind drafts in the same process (de856b5).
export PYTHONUNBUFFERED=1 TQDM_DISABLE=1 PYTHONPATH=$PWD
nvidia-smi -L; date; mkdir -p $OUT/g5
timeout -k 5 170 python3 scripts/gpu_check.py --sections S --out $OUT/g5/gpu_check_s.json > $OUT/g5/gpu_check_s.log 2>&1
echo "S rc $?"; grep -a -E "FAILED|rror|all checks|false|sync inside" $OUT/g5/gpu_check_s.log | head -20; date
timeout -k 5 ${LIMIT:-380} python3 scripts/gpu_check.py --sections LF --logprobs-timings smollm2-135m,qwen3-8b \
  --out $OUT/g5/gpu_check_lf_timings.json > $OUT/g5/gpu_check_lf_timings.log 2>&1
echo "LF rc $?"; grep -a -E "FAILED|rror|all checks|false|graphed ms|log_softmax_rows" $OUT/g5/gpu_check_lf_timings.log | head -20; date
