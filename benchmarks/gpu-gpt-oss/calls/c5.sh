#!/bin/bash
# Call 5: the regression check after the window-sized splits, on the default Qwen3 target (no window).
export PYTHONPATH=$PWD TQDM_DISABLE=1 PYTHONUNBUFFERED=1
timeout 420 python3 scripts/gpu_check.py --sections ABCEFPRS --attentions splitkv,flex \
  --out $OUT/gpu_check_qwen3.json > $OUT/qwen3.log 2>&1; echo "rc $?"; tail -1 $OUT/qwen3.log
