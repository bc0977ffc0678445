#!/bin/bash
# The shipped pair (v5 drafter) at batch 1 with the tree kernel default; then Qwen3-8B tree kernel A/B.
S=$SECONDS
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1 TREEFLASH_CACHE=$HOME/tfcache TQDM_DISABLE=1
mkdir -p ~/c
B="python3 -m treeflash.cli bench --model $HOME/smollm2.gguf --draft-model treeflash/default_drafter --max-tokens 128 --no-plots"
part() { local name=$1 limit=$2; shift 2
  if [ $((S + ${BUDGET:-560} - SECONDS)) -lt $limit ]; then echo "skip $name"; return; fi
  echo "=== $name $(date +%T)"; echo "$B $* --out $name.json" > ~/c/$name.cmd
  timeout -k 5 $limit $B "$@" --out ~/c/$name.json > ~/c/$name.log 2>&1; echo "rc $? $(date +%T)"
  grep -A12 -E '^(humaneval|mtbench) x' ~/c/$name.log | head -14; cp ~/c/$name.* $OUT/; }
part speed-humaneval-t0 200 --dataset humaneval --num-prompts 24 --methods none,dflash,ddtree:16,ddtree:32,ddtree:64,ddtree:auto
part speed-mtbench-t0 170 --dataset mtbench --num-prompts 24 --methods none,dflash,ddtree:32,ddtree:64,ddtree:auto
L=$((S + ${BUDGET:-560} - SECONDS - 5)); if [ $L -gt 60 ]; then
timeout $L python3 -m treeflash.cli bench --context 1024 --rounds 20 --stage-rounds 3 --no-plots --variants compiled/16,compiled/16/treekernel \
  --synthetic qwen3-8b --batch-methods '1=none,ddtree:64' --out $OUT/qwen3-8b-tk.json > $OUT/qwen3-8b-tk.log 2>&1; echo "q rc $?"; cat $OUT/qwen3-8b-tk.txt; fi
