#!/bin/bash
# Session 2026-12-04 (seventh), call 1: stage the GGUF's first part and the shipped drafter outside the repository
# copy (the repository travels without benchmarks/ and results/); then gpu_check sections A, B, C and T at HEAD
# (not run since the graph-pool change; P, E, F ran at 00d0fb3).
mkdir -p ~/stage && cp .stage/a/part00 ~/stage/ && cp -r treeflash/default_drafter ~/d13 && ls ~/stage ~/d13 || exit 2
nvidia-smi -L; python3 -c "import torch, triton; print(torch.__version__, triton.__version__)"; date
export PYTHONUNBUFFERED=1 TQDM_DISABLE=1 PYTHONPATH=$PWD TREEFLASH_CACHE=$HOME/tfcache
timeout 400 python3 scripts/gpu_check.py --sections ABCT --out $OUT/gpu_check_abct.json > $OUT/gpu_check_abct.log 2>&1
echo "gpu_check rc $?"; grep -E 'passed|FAILED|Error|"seconds"' $OUT/gpu_check_abct.log | tail -20; date
