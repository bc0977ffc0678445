#!/bin/bash
# Join the staged blob, convert the GGUF, then SmolLM2 speed (shipped drafter) on MT-Bench and HumanEval.
test -f ~/stage/p08 || { echo "p08 missing: not warm"; exit 3; }
cat ~/stage/p0[0-8] .stage/g9/p09 > ~/blob.tar
sha256sum ~/blob.tar | grep -q ^bf9169344c3fd9c0525149b11cdfaaf444047ef9e9cf46ce4284d5156ff8f648 || { echo "bad blob sha256"; exit 4; }
tar xf ~/blob.tar -C ~/stage && rm ~/blob.tar ~/stage/p0* && mv ~/stage/smollm2.gguf ~/ || exit 5
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1 TREEFLASH_CACHE=$HOME/tfcache TQDM_DISABLE=1
python3 -m treeflash.cli convert ~/smollm2.gguf 2>&1 | tail -1
mkdir -p ~/b; END=$((SECONDS + ${BUDGET:-400}))
part() { local name=$1 limit=$2; shift 2
  local B="python3 -m treeflash.cli bench --model $HOME/smollm2.gguf --draft-model treeflash/default_drafter --max-tokens 128 --no-plots"
  if [ $((END - SECONDS)) -lt $limit ]; then echo "skip $name (left $((END - SECONDS)) s)"; return; fi
  echo "=== $name $(date +%T)"; echo "$B $* --out $name.json" > ~/b/$name.cmd
  timeout -k 5 $limit $B "$@" --out ~/b/$name.json > ~/b/$name.log 2>&1; echo "rc $? $(date +%T)"
  grep -A12 -E '^(humaneval|mtbench) x' ~/b/$name.log | head -14; tar czf $OUT/bench.tgz -C ~ b; }
SPEED="--num-prompts 24 --methods none,dflash,ddtree:32,ddtree:64"
part fused-speed-mtbench-t0 120 --dataset mtbench $SPEED
part fused-speed-humaneval-t0 120 --dataset humaneval $SPEED
