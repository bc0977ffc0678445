#!/bin/bash
# Call A: stage the GGUF's first part and the shipped drafter outside the repository copy; then the Qwen3-8B
# shape's rounds (random weights), the draft-vocabulary variant and the whole vocabulary in one process.
mkdir -p ~/stage && cp .stage/g/a/part00 ~/stage/ && cp -r treeflash/default_drafter ~/d13 && ls -la ~/stage ~/d13 || exit 2
nvidia-smi -L; python3 -c "import torch, triton; print(torch.__version__, triton.__version__)"; date
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TQDM_DISABLE=1
mkdir -p $OUT/q8
CMD="python3 -m treeflash.cli bench --synthetic qwen3-8b --context 1024 --rounds 20 --stage-rounds 2 --no-plots --batch-sizes 1 --methods none,dflash,ddtree:64,ddtree:256 --variants compiled/16/dv32768,compiled/16"
echo "$CMD --out q8-dv.json" > $OUT/q8/cmd.txt
timeout -k 5 ${LIMIT:-220} $CMD --out $OUT/q8/q8-dv.json 2>&1 | grep -v -i warn | tee $OUT/q8/q8-dv.log | tail -30
date
