#!/bin/bash
# Call 4: this tree's warm-up at the server's shape once more, now that LLM.warm_up empties the allocator's cache
# of the eager warm-up rounds' blocks at its end (empty caches: a fresh machine), then gpu_check P again.
export PYTHONUNBUFFERED=1 TQDM_DISABLE=1 TRITON_CACHE_DIR=$HOME/tf/triton
ARGS="--model $PWD/.stage/rand --random-weights --draft-model $PWD/treeflash/default_drafter --max-num-seqs 32 --sampling greedy,temperature,top_p --no-profile"
echo "== final $(date +%T)"
TREEFLASH_CACHE=$HOME/tf-final timeout 300 python3 benchmarks/capture_cost.py $ARGS --out $OUT/final.json 2> $OUT/final.log | grep -E '"(warm_up_s|graphs)"|reserved"|allocated|after'
echo "rc $?; captured: $(grep -c captured $OUT/final.log)"
timeout 150 python3 scripts/gpu_check.py --sections P --out $OUT/gpu_check_p.json > $OUT/gpu_check_p.log 2>&1
echo "rc $?"; tail -12 $OUT/gpu_check_p.log
