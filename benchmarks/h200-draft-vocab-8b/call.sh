#!/bin/bash
# One call: the Qwen3-8B shape's rounds with the drafter over a 32,768-token draft vocabulary and over the whole
# vocabulary, same process, same random weights (the dv variant first: it gets the per-stage pass).
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TQDM_DISABLE=1
nvidia-smi -L
CMD="python3 -m treeflash.cli bench --synthetic qwen3-8b --context 1024 --rounds 20 --stage-rounds 2 --no-plots --batch-sizes 1 --methods none,dflash,ddtree:64,ddtree:256 --variants compiled/16/dv32768,compiled/16"
echo "$CMD --out q8-dv.json" > $OUT/cmd.txt
timeout -k 5 ${LIMIT:-200} $CMD --out $OUT/q8-dv.json 2>&1 | grep -v -i warn | tee $OUT/q8-dv.log | tail -30
