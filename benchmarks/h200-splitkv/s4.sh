#!/bin/bash
# Call 4: join the GGUF, then the batch-1 speed benches of the shipped pair (default attention: splitkv).
S=$SECONDS
test -f ~/stage/p2 || { echo "p2 missing: not warm"; exit 3; }
cat ~/stage/p0 ~/stage/p1 ~/stage/p2 .stage/g7/p3 > ~/smollm2.gguf
sha256sum ~/smollm2.gguf | grep -q ^b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53 || { echo "bad gguf sha256"; exit 4; }
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1 TREEFLASH_CACHE=$HOME/tfcache TQDM_DISABLE=1
mkdir -p ~/b
B="python3 -m treeflash.cli bench --model $HOME/smollm2.gguf --draft-model treeflash/default_drafter --max-tokens 128 --no-plots"
part() { local name=$1 limit=$2; shift 2
  if [ $((S + 575 - SECONDS)) -lt $limit ]; then echo "skip $name"; return; fi
  echo "=== $name $(date +%T)"; echo "$B $* --out $name.json" > ~/b/$name.cmd
  timeout -k 5 $limit $B "$@" --out ~/b/$name.json > ~/b/$name.log 2>&1; echo "rc $? $(date +%T)"
  grep -A12 -E '^(humaneval|mtbench) x' ~/b/$name.log | head -14; cp ~/b/$name.* $OUT/; }
part speed-humaneval-t0 240 --dataset humaneval --num-prompts 24 --methods none,dflash,ddtree:16,ddtree:32,ddtree:64,ddtree:auto
part speed-mtbench-t0 240 --dataset mtbench --num-prompts 24 --methods none,dflash,ddtree:32,ddtree:64,ddtree:auto
