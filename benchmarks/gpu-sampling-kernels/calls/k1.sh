#!/bin/bash
# Call 1: the structure kernels (treeflash/structure_kernel.py) on the GPU. Section S: structured rounds
# (graphed, eager, drafts adjusted and blind, every method) give none's tokens, and the kernels give
# GrammarSlots' torch ops' masks and states at real vocabularies. Section L with timings: graphed rounds with
# every slot structured through the kernels ("structured outputs") and through the torch ops ("... torch ops"),
# in the same process, beside the plain round.
export PYTHONUNBUFFERED=1 TQDM_DISABLE=1 PYTHONPATH=$PWD
nvidia-smi -L; date; mkdir -p $OUT/k1
timeout -k 5 200 python3 scripts/gpu_check.py --sections S --out $OUT/k1/gpu_check_s.json > $OUT/k1/gpu_check_s.log 2>&1
echo "S rc $?"; grep -a -E "FAILED|Error|all checks|false|sync inside" $OUT/k1/gpu_check_s.log | head -20; date
timeout -k 5 ${LIMIT:-330} python3 scripts/gpu_check.py --sections L --logprobs-timings smollm2-135m,qwen3-8b \
  --out $OUT/k1/gpu_check_l_timings.json > $OUT/k1/gpu_check_l_timings.log 2>&1
echo "L rc $?"; grep -a -E "FAILED|Error|all checks|false|graphed ms" $OUT/k1/gpu_check_l_timings.log | head -20; date
