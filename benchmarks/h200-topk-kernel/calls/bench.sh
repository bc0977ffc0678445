#!/bin/bash
# Bench parts in order of importance, each skipped if done or if less time is left than its limit
# ($END: $SECONDS deadline of this call). Results accumulate in ~/b; $OUT/bench.tgz. The shipped drafter's
# batch-1 speed runs in the same call as the new one's: sessions' machines differ by 3-8%.
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1 TREEFLASH_CACHE=$HOME/tfcache TQDM_DISABLE=1
mkdir -p ~/b
part() { local name=$1 limit=$2 drafter=$3; shift 3
  local B="python3 -m treeflash.cli bench --model $HOME/smollm2.gguf --draft-model $drafter --max-tokens 128 --no-plots"
  if [ -f ~/b/$name.json ]; then return; fi
  if [ $((END - SECONDS)) -lt $limit ]; then echo "skip $name (left $((END - SECONDS)) s)"; return; fi
  echo "=== $name $(date +%T)"; echo "$B $* --out $name.json" > ~/b/$name.cmd
  timeout -k 5 $limit $B "$@" --out ~/b/$name.json > ~/b/$name.log 2>&1; echo "rc $? $(date +%T)"
  grep -A12 -E '^(humaneval|mtbench) x' ~/b/$name.log | head -14; tar czf $OUT/bench.tgz -C ~ b; }
NEW=$HOME/run/drafter; SHIPPED=treeflash/default_drafter
ACC="--num-prompts 0 --batch-size 32 --cuda-graph-sizes 32 --methods dflash,ddtree:64"
SPEED="--num-prompts 24 --methods none,dflash,ddtree:32,ddtree:64"
part shipped-speed-mtbench-t0 110 $SHIPPED --dataset mtbench $SPEED
if [ ! -f ~/fallback -a ! -f ~/b/mainkernel-speed-mtbench-t0.json ]; then  # the same, with main's tree kernel
  cp treeflash/tree_kernel.py ~/tk_next.py && cp .stage/tk_main.py treeflash/tree_kernel.py
  part mainkernel-speed-mtbench-t0 110 $SHIPPED --dataset mtbench $SPEED
  cp ~/tk_next.py treeflash/tree_kernel.py; fi
part shipped-speed-humaneval-t0 110 $SHIPPED --dataset humaneval $SPEED
if [ ! -f ~/fallback -a ! -f ~/b/mainkernel-speed-humaneval-t0.json ]; then
  cp treeflash/tree_kernel.py ~/tk_next.py && cp .stage/tk_main.py treeflash/tree_kernel.py
  part mainkernel-speed-humaneval-t0 110 $SHIPPED --dataset humaneval $SPEED
  cp ~/tk_next.py treeflash/tree_kernel.py; fi
tar czf $OUT/bench.tgz -C ~ b; ls ~/b
