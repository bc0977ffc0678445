#!/bin/bash
# Call 4 (as run, one line; the same machine as call 3): the server's warm-up shape (32 slots, greedy, temperature,
# temperature + top_p), this tree's code, twice in a row; the treeflash cache (and so Triton's) already held
# call 3's batch-1 greedy kernels and costs.
export PYTHONUNBUFFERED=1 TQDM_DISABLE=1 PYTHONPATH=$PWD TREEFLASH_CACHE=$HOME/tf-new; A="--model $PWD/.stage/rand --random-weights --draft-model $PWD/treeflash/default_drafter --max-num-seqs 32 --sampling greedy,temperature,top_p --no-profile"; for i in 1 2; do echo "== serve-shape warm-up $i $(date +%T)"; timeout $((i==1 ? 330 : 140)) python3 benchmarks/capture_cost.py $A --out $OUT/s32_$i.json 2> $OUT/s32_$i.log | grep -E '"(warm_up_s|graphs|build_s)"'; grep -c captured $OUT/s32_$i.log; done; du -sh ~/tf-new
