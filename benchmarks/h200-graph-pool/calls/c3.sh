#!/bin/bash
# Call 3 (the same machine, caches warm): graph memory at the server's shape, A/B in one call: this tree (one capture stream, one pool) and the
# parent commit's treeflash (.stage/base: a stream per capture). SmolLM2-135M shape, random weights, the shipped
# drafter, 32 slots, greedy / temperature / top_p (the server's warm-up: costs measured, then every graph captured).
export PYTHONUNBUFFERED=1 TQDM_DISABLE=1 TRITON_CACHE_DIR=$HOME/tf/triton
ARGS="--model $PWD/.stage/rand --random-weights --draft-model $PWD/treeflash/default_drafter --max-num-seqs 32 --sampling greedy,temperature,top_p --no-profile"
one() {  # one NAME DIR LIMIT
  echo "== $1 $(date +%T)"
  (cd $2 && PYTHONPATH=$2 TREEFLASH_CACHE=$HOME/tf-$1 timeout $3 python3 benchmarks/capture_cost.py $ARGS --out $OUT/$1.json 2> $OUT/$1.log | grep -E '"(warm_up_s|graphs)"|reserved"|allocated|after')
  echo "rc $?; captured: $(grep -c captured $OUT/$1.log)"
}
one new $PWD 200
one base $PWD/.stage/base 200
