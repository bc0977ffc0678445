#!/bin/bash
# Session 2026-12-04 (seventh): kernel-by-kernel profile of graphed Qwen3-8B-shape rounds up to budget 256
# (random weights, context 1024, batch 1), to say how much of a DDTree-256 round is matrix products.
export PYTHONUNBUFFERED=1 TQDM_DISABLE=1 TRITON_CACHE_DIR=$HOME/tf/triton PYTHONPATH=$PWD
nvidia-smi -L; python3 -c "import torch, triton; print(torch.__version__, triton.__version__)"; date
timeout 300 python3 benchmarks/kernel_profile.py --shape qwen3-8b --context 1024 --methods none,ddtree:64,ddtree:256 --modes graphs --rows 90 --out $OUT/prof-qwen3-8b-256.txt > $OUT/prof-qwen3-8b-256.log 2>&1
echo "prof rc $?"; grep "^==" $OUT/prof-qwen3-8b-256.txt; date
