#!/bin/bash
# Graph memory A/B in one call (fresh machine): this tree (captures recorded on the runner's one stream) and
# 80191ee's treeflash (.stage/old: a new stream per capture), the same greedy warm-up at buckets 1 and 2 (auto
# budget: costs measured, then captured), the allocator's memory after each; both read one Triton cache.
export PYTHONUNBUFFERED=1 TQDM_DISABLE=1 TRITON_CACHE_DIR=$HOME/tf/triton
ARGS="--model $PWD/.stage/rand --random-weights --draft-model $PWD/treeflash/default_drafter --max-num-seqs 2 --sampling greedy --no-profile"
one() {  # one NAME DIR LIMIT
  echo "== $1 $(date +%T)"
  (cd $2 && PYTHONPATH=$2 TREEFLASH_CACHE=$HOME/tf-$1 timeout $3 python3 benchmarks/capture_cost.py $ARGS --out $OUT/$1.json 2> $OUT/$1.log | grep -E '"(warm_up_s|graphs)"|reserved|allocated')
}
one new $PWD 170
one old $PWD/.stage/old 100
