#!/bin/bash
# Call 5: gpu_check E on the code that lands (main + the one-reduction q/k piece; no fused merge), every attention.
export PYTHONPATH=$PWD TQDM_DISABLE=1 PYTHONUNBUFFERED=1
timeout 420 python3 scripts/gpu_check.py --sections E --out $OUT/gpu_check_e.json > ~/e.log 2>&1
echo "E rc $?"; tail -3 ~/e.log
