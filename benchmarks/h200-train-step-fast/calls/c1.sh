#!/bin/bash
# Call 1: stage blob part p1 (the blob = smollm2.gguf.xz, sharegpt-all, code-prompts-all; the repository travels
# without benchmarks/ and results/) and keep the shipped (thirteenth) drafter; then the train-step profile of
# this tree's package against the parent commit's (.stage/old), same script, same random weights and batches.
mkdir -p ~/stage && cp .stage/x15/a/p1 ~/stage/ && cp -r treeflash/default_drafter ~/drafter0 && ls -la ~/stage ~/drafter0 || exit 2
nvidia-smi -L; date
export PYTHONUNBUFFERED=1
mkdir -p $OUT/new $OUT/old
PYTHONPATH=$PWD timeout 150 python3 .stage/x15/train_step_profile.py --warmup 60 --steps 15 --out $OUT/new 2>&1 | grep -v -i warn | tee $OUT/new/log.txt | head -60
PYTHONPATH=$PWD/.stage/old timeout 100 python3 .stage/x15/train_step_profile.py --warmup 60 --steps 15 --distills 0.5 --no-profile --out $OUT/old 2>&1 | grep -v -i warn | tee $OUT/old/log.txt
date
