#!/bin/bash
# With the tree kernel default: host-sync checks C/F; Qwen3-8B stage split with the tree kernel; then,
# with the time left, the 4-layer drafter of this session's run: acceptance on MT-Bench / HumanEval (T=0).
S=$SECONDS
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1 TREEFLASH_CACHE=$HOME/tfcache TQDM_DISABLE=1
timeout 120 python3 scripts/gpu_check.py --sections CF --attentions splitkv --out $OUT/gpu_check_cf.json > $OUT/gpu_check_cf.log 2>&1
echo "CF rc $?"; tail -1 $OUT/gpu_check_cf.log
timeout 170 python3 -m treeflash.cli bench --context 1024 --rounds 20 --stage-rounds 3 --no-plots --variants compiled/16/treekernel \
  --synthetic qwen3-8b --batch-methods '1=none,ddtree:64,ddtree:256 8=none,ddtree:64' --out $OUT/qwen3-8b-tk-stages.json > $OUT/qwen3-8b-tk-stages.log 2>&1
echo "q rc $?"; cat $OUT/qwen3-8b-tk-stages.txt
test -d ~/run/drafter || exit 0
mkdir -p $OUT/d4 && cp ~/run/drafter/* $OUT/d4/ && tar czf $OUT/d4/run.tgz -C ~ run/history.json run/train.log
B="python3 -m treeflash.cli bench --model $HOME/smollm2.gguf --draft-model $HOME/run/drafter --max-tokens 128 --no-plots"
ACC="--num-prompts 0 --batch-size 32 --cuda-graph-sizes 32 --methods dflash,ddtree:64"
for p in "mtbench 80" "humaneval 110"; do set -- $p
  if [ $((S + ${BUDGET:-480} - SECONDS)) -lt $2 ]; then echo "skip $1"; continue; fi
  timeout $2 $B --dataset $1 $ACC --out $OUT/d4/acc-$1-t0.json > $OUT/d4/acc-$1-t0.log 2>&1; echo "$1 rc $?"
  grep -A4 -E '^(humaneval|mtbench) x' $OUT/d4/acc-$1-t0.log; done
