#!/bin/bash
# Session 2026-12-04 (seventh): the SmolLM2-135M synthetic shape with the drafter over a 16,384-token draft
# vocabulary, as the shipped drafter drafts, against the whole vocabulary, in one process (random weights,
# context 1024, batch 1, steps back to back).
export PYTHONUNBUFFERED=1 TQDM_DISABLE=1 PYTHONPATH=$PWD
nvidia-smi -L; python3 -c "import torch, triton; print(torch.__version__, triton.__version__)"; date
mkdir -p $OUT/s
CMD="python3 -m treeflash.cli bench --synthetic smollm2-135m --context 1024 --rounds 40 --stage-rounds 0 --no-plots --batch-sizes 1 --methods none,ddtree:64 --variants compiled/16/dv16384,compiled/16,compiled/16/dv16384,compiled/16"
echo "$CMD --out smollm2-dv.json" > $OUT/s/cmd.txt
timeout -k 5 300 $CMD --out $OUT/s/smollm2-dv.json 2>&1 | grep -v -i warn | tee $OUT/s/smollm2-dv.log | tail -25
date
