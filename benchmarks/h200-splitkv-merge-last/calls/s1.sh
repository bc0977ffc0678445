#!/bin/bash
# Session 2026-12-04 (sixth), call 1: the GPU checks at HEAD (P, E, F), then kernel-by-kernel profiles of graphed
# rounds at the SmolLM2 and Qwen3-8B shapes (random weights, context 1024, batch 1).
export PYTHONUNBUFFERED=1 TQDM_DISABLE=1 TRITON_CACHE_DIR=$HOME/tf/triton PYTHONPATH=$PWD
nvidia-smi -L; python3 -c "import torch, triton; print(torch.__version__, triton.__version__)"; date
timeout 330 python3 scripts/gpu_check.py --sections PEF --out $OUT/gpu_check_pef.json > $OUT/gpu_check_pef.log 2>&1
echo "gpu_check rc $?"; grep -E 'passed|FAILED|Error' $OUT/gpu_check_pef.log | tail -30; date
timeout 100 python3 benchmarks/kernel_profile.py --shape smollm2-135m --context 1024 --methods none,dflash,ddtree:64 --modes graphs --rows 90 --out $OUT/prof-smollm2.txt > $OUT/prof-smollm2.log 2>&1
echo "prof smollm2 rc $?"; grep "^==" $OUT/prof-smollm2.txt; date
timeout 130 python3 benchmarks/kernel_profile.py --shape qwen3-8b --context 1024 --methods none,ddtree:64 --modes graphs --rows 90 --out $OUT/prof-qwen3-8b.txt > $OUT/prof-qwen3-8b.log 2>&1
echo "prof qwen3-8b rc $?"; grep "^==" $OUT/prof-qwen3-8b.txt; date
