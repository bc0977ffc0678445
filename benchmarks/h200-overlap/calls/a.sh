#!/bin/bash
# Call A: stage the GGUF's first part and the shipped drafter outside the repository copy; then the Qwen3-8B
# shape's AR step and DDTree-64 round (random weights) with the engine's overlap and without (/sync).
mkdir -p ~/stage && cp .stage/a/part00 ~/stage/ && cp -r treeflash/default_drafter ~/d13 && ls -la ~/stage ~/d13 || exit 2
nvidia-smi -L; python3 -c "import torch, triton; print(torch.__version__, triton.__version__)"; date
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TQDM_DISABLE=1
mkdir -p $OUT/q8
CMD="python3 -m treeflash.cli bench --synthetic qwen3-8b --context 1024 --rounds 20 --stage-rounds 0 --no-plots --batch-sizes 1 --methods none,none/sync,ddtree:64,ddtree:64/sync"
echo "$CMD --out q8.json" > $OUT/q8/cmd.txt
timeout -k 5 ${LIMIT:-170} $CMD --out $OUT/q8/q8.json 2>&1 | grep -v -i warn | tee $OUT/q8/q8.log | tail -25
date
