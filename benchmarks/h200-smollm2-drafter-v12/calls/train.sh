#!/bin/bash
# train-drafter for calls 2-3: the shipped (eleventh) drafter trained further, same shape and loss (--distill 0.5),
# on responses generated afresh with seed 2 (new samples in the sampled modes), with every HumanEval-form code
# prompt of the site-packages (19,667; the eleventh's 12,564 capped each package at 1,000).
# $1: seconds this call may spend; $2: minutes of data generation (0: train on the cached responses).
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1 TREEFLASH_CACHE=$HOME/tfcache
TRAIN_ARGS="--num-prompts 60000 --num-eval-prompts 32 --max-new-tokens 256 --max-prompt-tokens 256 --gen-batch-size 1024
 --extra-temperatures 1.0 --num-layers 3 --block-size 16 --target-layer-ids 1,8,14,21,27 --mask-token-id 16
 --init-from $HOME/drafter0 --draft-vocab-size 16384 --distill 0.5 --seed 2
 --steps 100000 --batch-size 64 --blocks-per-seq 32 --lr 3e-4 --warmup-steps 100 --train-minutes 8.5
 --eval-every 2000 --eval-budget 64 --eval-max-new-tokens 128 --checkpoint-every 200 --device cuda --log-every 100"
echo "train-drafter $TRAIN_ARGS --data-minutes $2" >> ~/train_args.txt
timeout -k 5 $1 python3 -m treeflash.cli train-drafter --target ~/smollm2.gguf --out ~/run \
  --prompts $HOME/stage/sharegpt-all.jsonl.gz,$HOME/stage/code-prompts-all.jsonl.gz --data-dir ~/data --checkpoint-dir ~/ckpt $TRAIN_ARGS --data-minutes $2 2>&1 \
  | grep --line-buffered -v -E 'Warning|warn\(' | tee -a ~/train_out.log | grep --line-buffered -v '^\[.*step [0-9]*/'
echo "train exit ${PIPESTATUS[0]} $(date +%T)"
