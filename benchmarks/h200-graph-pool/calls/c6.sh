#!/bin/bash
# Call 6 (a fresh machine): top_p's sort in groups of rows (bounds 2^24-2^27 elements), at most 2^26 the default, against one sort of every row (masks, time, peak
# memory), then the server-shaped warm-up's memory with it (as call 4).
export PYTHONUNBUFFERED=1 TQDM_DISABLE=1 TRITON_CACHE_DIR=$HOME/tf/triton
timeout 120 python3 benchmarks/h200-graph-pool/top_p_chunks.py $OUT/top_p_chunks.json; echo "rc $?"
ARGS="--model $PWD/.stage/rand --random-weights --draft-model $PWD/treeflash/default_drafter --max-num-seqs 32 --sampling greedy,temperature,top_p --no-profile"
echo "== groups $(date +%T)"
TREEFLASH_CACHE=$HOME/tf-groups timeout 330 python3 benchmarks/capture_cost.py $ARGS --out $OUT/groups.json 2> $OUT/groups.log | grep -E '"(warm_up_s|graphs)"|reserved"|allocated|after'
echo "rc $?; captured: $(grep -c captured $OUT/groups.log)"
