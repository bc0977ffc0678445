#!/bin/bash
# Session 2026-12-04 (seventh): the SmolLM2-135M synthetic shape at contexts 256 and 512 (the real runs' prompts
# and answers come to ~150-400 tokens), to see whether context explains 1.6x here against 1.42x with the real model.
export PYTHONUNBUFFERED=1 TQDM_DISABLE=1 PYTHONPATH=$PWD
nvidia-smi -L; date
for c in 256 512; do
mkdir -p $OUT/c$c
CMD="python3 -m treeflash.cli bench --synthetic smollm2-135m --context $c --rounds 40 --stage-rounds 0 --no-plots --batch-sizes 1 --methods none,ddtree:64"
echo "$CMD --out smollm2-c$c.json" > $OUT/c$c/cmd.txt
timeout -k 5 150 $CMD --out $OUT/c$c/smollm2-c$c.json 2>&1 | grep -v -i warn > $OUT/c$c/smollm2-c$c.log; tail -4 $OUT/c$c/smollm2-c$c.log
done
date
