#!/bin/bash
# train-drafter for calls c10-c11 of chain11: the shipped (ninth) drafter, same shape (three layers),
# trained further on the cached 107,707 responses with all of each position's loss against the target's
# distribution (--distill 1.0), peak lr 2e-4, 10 minutes of steps over two calls. $1: seconds this call may spend.
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1 TREEFLASH_CACHE=$HOME/tfcache
TRAIN_ARGS="--num-prompts 47000 --num-eval-prompts 32 --max-new-tokens 256 --max-prompt-tokens 256 --gen-batch-size 1024
 --extra-temperatures 1.0 --num-layers 3 --block-size 16 --target-layer-ids 1,8,14,21,27 --mask-token-id 16
 --init-from treeflash/default_drafter --draft-vocab-size 16384 --distill 1.0
 --steps 100000 --batch-size 64 --blocks-per-seq 32 --lr 2e-4 --warmup-steps 100 --train-minutes 10
 --eval-every 2000 --eval-budget 64 --eval-max-new-tokens 128 --checkpoint-every 200 --device cuda --log-every 100"
echo "train-drafter $TRAIN_ARGS --data-minutes 0" >> ~/train_args.txt
timeout -k 5 $1 python3 -m treeflash.cli train-drafter --target ~/smollm2.gguf --out ~/run \
  --prompts ~/stage/sharegpt-all.jsonl.gz,~/stage/code-prompts.jsonl.gz --data-dir ~/data --checkpoint-dir ~/ckpt $TRAIN_ARGS --data-minutes 0 2>&1 \
  | grep --line-buffered -v -E 'Warning|warn\(' | tee -a ~/train_out.log | grep --line-buffered -v '^\[.*step [0-9]*/'
echo "train exit ${PIPESTATUS[0]} $(date +%T)"
