#!/bin/bash
# Call D: bench the drafter trained by call C (~/run/drafter) on the H200; everything lands in $OUT/bench.tgz.
test -f ~/smollm2.gguf -a -f ~/run/drafter/config.json || { echo "no model/drafter: not warm"; exit 3; }
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1 TREEFLASH_CACHE=$HOME/tfcache
mkdir -p ~/b; cp -r ~/run/drafter ~/b/drafter
B="python3 -m treeflash.cli bench --model $HOME/smollm2.gguf --draft-model $HOME/run/drafter --max-tokens 128 --no-plots"
run() { local name=$1 limit=$2; shift 2; echo "=== $name $(date +%T)"; timeout $limit $B "$@" --out ~/b/$name.json > ~/b/$name.log 2>&1; echo "rc $? $(date +%T)"; tail -15 ~/b/$name.log; }
(
run acc-humaneval-t0 90 --dataset humaneval --num-prompts 0 --batch-size 16 --methods none,dflash,ddtree:64
run acc-mtbench-t0 75 --dataset mtbench --num-prompts 0 --batch-size 16 --methods none,dflash,ddtree:64
run acc-mtbench-t1 75 --dataset mtbench --num-prompts 0 --batch-size 16 --temperature 1 --methods none,dflash,ddtree:64
run speed-humaneval-t0 120 --dataset humaneval --num-prompts 24 --methods none,dflash,ddtree:16,ddtree:32,ddtree:64,ddtree:auto
run speed-mtbench-t0 100 --dataset mtbench --num-prompts 24 --methods none,dflash,ddtree:32,ddtree:64,ddtree:auto
run side-by-side 90 --dataset humaneval --num-prompts 4 --methods none,dflash,ddtree:64 --baselines hf,dflash-ref,ddtree-ref --ddtree-ref .stage/ddtree-ref --ref-budget 64
) 2>&1
tar czf $OUT/bench.tgz -C ~ b; ls -la $OUT; date
