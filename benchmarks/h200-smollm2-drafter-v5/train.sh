#!/bin/bash
# train-drafter for calls 4 and 5 (same options: 5 resumes 4's data cache and checkpoint).
# $1: seconds this call may spend on it; $2: --data-minutes.
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1 TREEFLASH_CACHE=$HOME/tfcache
TRAIN_ARGS="--num-prompts 28000 --num-eval-prompts 32 --max-new-tokens 256 --max-prompt-tokens 256 --gen-batch-size 1024
 --extra-temperatures 1.0 --num-layers 3 --block-size 16 --target-layer-ids 1,8,14,21,27 --mask-token-id 16
 --init-from treeflash/default_drafter --draft-vocab-size 16384
 --steps 100000 --batch-size 64 --blocks-per-seq 32 --lr 6e-4 --warmup-steps 200 --train-minutes 7
 --eval-every 1000 --eval-budget 64 --eval-max-new-tokens 128 --checkpoint-every 200 --device cuda --log-every 100"
echo "train-drafter $TRAIN_ARGS --data-minutes $2" > ~/train_args.txt
timeout -k 5 $1 python3 -m treeflash.cli train-drafter --target ~/smollm2.gguf --out ~/run \
  --prompts ~/stage/prompts.jsonl.gz,~/stage/code-prompts.jsonl.gz --data-dir ~/data --checkpoint-dir ~/ckpt $TRAIN_ARGS --data-minutes $2 2>&1 \
  | grep --line-buffered -v -E 'Warning|warn\(' | tee -a ~/train_out.log | grep --line-buffered -v '^\[.*step [0-9]*/'
echo "train exit ${PIPESTATUS[0]} $(date +%T)"
