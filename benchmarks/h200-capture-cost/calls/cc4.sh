#!/bin/bash
# Call 5 (as run, one line; the same machine): the same, from empty treeflash, Triton and Inductor caches, then
# restarted.
export PYTHONUNBUFFERED=1 TQDM_DISABLE=1 PYTHONPATH=$PWD TREEFLASH_CACHE=$HOME/tf-clean TORCHINDUCTOR_CACHE_DIR=$HOME/ind-clean; rm -rf ~/tf-clean ~/ind-clean; nvidia-smi -L; A="--model $PWD/.stage/rand --random-weights --draft-model $PWD/treeflash/default_drafter --max-num-seqs 32 --sampling greedy,temperature,top_p --no-profile"; for i in 1 2; do echo "== serve-shape warm-up, empty caches then restarted: $i $(date +%T)"; timeout $((i==1 ? 300 : 100)) python3 benchmarks/capture_cost.py $A --out $OUT/clean_$i.json 2> $OUT/clean_$i.log | grep -E '"(warm_up_s|graphs|build_s)"'; grep -c captured $OUT/clean_$i.log; done; du -sh ~/tf-clean ~/ind-clean
