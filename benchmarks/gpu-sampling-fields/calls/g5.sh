#!/bin/bash
# Call 5: after `penalize` broadcasts a shared past (87135b4): gpu_check L, F and S (structured outputs) with L's timings,
# which now also time penalties and allowed tokens with blind drafts in the same process (de856b5).
export PYTHONUNBUFFERED=1 TQDM_DISABLE=1 PYTHONPATH=$PWD
nvidia-smi -L; date; mkdir -p $OUT/g5
timeout -k 5 ${LIMIT:-560} python3 scripts/gpu_check.py --sections LFS --logprobs-timings smollm2-135m,qwen3-8b \
  --out $OUT/g5/gpu_check_lfs_timings.json > $OUT/g5/gpu_check_lfs_timings.log 2>&1
echo "LFS rc $?"; grep -a -E "FAILED|rror|all checks|false|graphed ms|log_softmax_rows" $OUT/g5/gpu_check_lfs_timings.log | head -20; date
