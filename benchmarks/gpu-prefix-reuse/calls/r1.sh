#!/bin/bash
# Call 1: prefix reuse (treeflash/prefix_reuse.py) on CUDA, graphs and overlap on. Section R: turns sharing
# whole prefill chunks give the tokens and log-probs of the engine with reuse off (float32 and bfloat16,
# none / ddtree + lookup, splitkv and flex attention); section B (speculative greedy and seeded sampling,
# with reuse on by default) as a check that nothing else moved.
export PYTHONUNBUFFERED=1 TQDM_DISABLE=1 PYTHONPATH=$PWD
nvidia-smi -L; date; mkdir -p $OUT/r1
timeout -k 5 400 python3 scripts/gpu_check.py --sections RB --out $OUT/r1/gpu_check_rb.json > $OUT/r1/gpu_check_rb.log 2>&1
echo "RB rc $?"; grep -a -E "FAILED|Error|all checks|false|differ" $OUT/r1/gpu_check_rb.log | head -20; date
