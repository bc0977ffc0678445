#!/bin/bash
# Call 5 (a fresh machine; the script's first version, at b25a182): top_p's sort a few rows at a time (2^24 elements) against one sort of every row (masks, time, peak
# memory), then the server-shaped warm-up's memory with it (as call 4).
export PYTHONUNBUFFERED=1 TQDM_DISABLE=1 TRITON_CACHE_DIR=$HOME/tf/triton
timeout 120 python3 benchmarks/h200-graph-pool/top_p_chunks.py $OUT/top_p_chunks.json; echo "rc $?"
ARGS="--model $PWD/.stage/rand --random-weights --draft-model $PWD/treeflash/default_drafter --max-num-seqs 32 --sampling greedy,temperature,top_p --no-profile"
echo "== chunked $(date +%T)"
TREEFLASH_CACHE=$HOME/tf-chunked timeout 330 python3 benchmarks/capture_cost.py $ARGS --out $OUT/chunked.json 2> $OUT/chunked.log | grep -E '"(warm_up_s|graphs)"|reserved"|allocated|after'
echo "rc $?; captured: $(grep -c captured $OUT/chunked.log)"
