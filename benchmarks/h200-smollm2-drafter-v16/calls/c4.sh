#!/bin/bash
# Call 4: the trained drafter (the final export) and its run's logs to $OUT; then acceptance on every
# MT-Bench / HumanEval prompt at T=0 and T=1 (batch 32); each part skipped if time is short.
test -f ~/run/drafter/config.json || { echo "not warm"; exit 3; }
END=$((SECONDS + ${LIMIT:-420}))
mkdir -p $OUT/run && cp ~/run/drafter/*.safetensors ~/run/drafter/draft_vocab.json $OUT/run/
tar czf $OUT/run/meta.tgz -C ~ run/drafter/config.json run/drafter/model.safetensors.index.json train_out.log train_args.txt \
  $(cd ~ && ls run/history.json run/train.log run/*.png 2>/dev/null)
ls -la $OUT/run
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1 TREEFLASH_CACHE=$HOME/tfcache TQDM_DISABLE=1
mkdir -p ~/b
part() { local name=$1 limit=$2 drafter=$3; shift 3
  local B="python3 -m treeflash.cli bench --model $HOME/smollm2.gguf --draft-model $drafter --max-tokens 128 --no-plots"
  if [ $((END - SECONDS)) -lt $limit ]; then echo "skip $name (left $((END - SECONDS)) s)"; return; fi
  echo "=== $name $(date +%T)"; echo "$B $* --out $name.json" > ~/b/$name.cmd
  timeout -k 5 $limit $B "$@" --out ~/b/$name.json > ~/b/$name.log 2>&1; echo "rc $? $(date +%T)"
  grep -A6 -E '^(humaneval|mtbench) x' ~/b/$name.log | head -8; tar czf $OUT/bench.tgz -C ~ b; }
NEW=$HOME/run/drafter
ACC="--num-prompts 0 --batch-size 32 --cuda-graph-sizes 32 --methods dflash,ddtree:64"
part acc-mtbench-t0 100 $NEW --dataset mtbench $ACC
part acc-humaneval-t0 120 $NEW --dataset humaneval $ACC
part acc-mtbench-t1 100 $NEW --dataset mtbench --temperature 1 $ACC
part acc-humaneval-t1 120 $NEW --dataset humaneval --temperature 1 $ACC
tar czf $OUT/bench.tgz -C ~ b; ls ~/b
SPEED="--num-prompts 24 --methods none,dflash,ddtree:32,ddtree:64"
part speed-humaneval-t0 150 $NEW --dataset humaneval $SPEED
part speed-mtbench-t0 150 $NEW --dataset mtbench $SPEED
tar czf $OUT/bench.tgz -C ~ b; ls ~/b
