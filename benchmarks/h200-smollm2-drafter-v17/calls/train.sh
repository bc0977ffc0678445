#!/bin/bash
# train-drafter for calls 2-3: the shipped (thirteenth) drafter trained further, same shape and loss (--distill 0.5),
# on responses at temperature 0 and the model card's sampling only (no --extra-temperatures 1.0, which every run
# since the third had): does T=1 data in the mix cost greedy acceptance? Prompts: every ShareGPT turn that stands
# alone, every code prompt, 15,000 own messages; seed 7 (fresh samples and messages).
# $1: seconds this call may spend; $2: minutes of response generation (0: train on the cached responses).
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1 TREEFLASH_CACHE=$HOME/tfcache
TRAIN_ARGS="--num-prompts 100000 --num-eval-prompts 32 --max-new-tokens 256 --max-prompt-tokens 256 --gen-batch-size 1024
 --num-layers 3 --block-size 16 --target-layer-ids 1,8,14,21,27 --mask-token-id 16
 --init-from $HOME/drafter0 --draft-vocab-size 16384 --distill 0.5 --seed 7
 --steps 100000 --batch-size 64 --blocks-per-seq 32 --lr 3e-4 --warmup-steps 100 --train-minutes ${TRAIN_MIN:-8}
 --eval-every 3000 --eval-budget 64 --eval-max-new-tokens 128 --checkpoint-every 200 --device cuda --log-every 100"
echo "train-drafter $TRAIN_ARGS --data-minutes $2" >> ~/train_args.txt
timeout -k 5 $1 python3 -m treeflash.cli train-drafter --target ~/smollm2.gguf --out ~/run \
  --prompts $HOME/stage/sharegpt-all.jsonl.gz,$HOME/stage/code-prompts-all.jsonl.gz,self:15000 \
  --data-dir ~/data --checkpoint-dir ~/ckpt $TRAIN_ARGS --data-minutes $2 2>&1 \
  | grep --line-buffered -v -E 'Warning|warn\(' | tee -a ~/train_out.log | grep --line-buffered -v -E '^\[.*step [0-9]*/|own prompts: [0-9]* kept'
echo "train exit ${PIPESTATUS[0]} $(date +%T)"
