#!/bin/bash
# Acceptance on every MT-Bench / HumanEval prompt (batch 32, 128 new tokens, DFlash chain and DDTree-64) of the
# new drafter at T=0 and T=1, and of the shipped one at T=0 on the same code; a part is skipped when done or
# when the call has too little time left. Results and logs accumulate in ~/b, archived to $OUT/bench.tgz.
END=$((SECONDS + ${LIMIT:-420}))
mkdir -p ~/b
part() { local name=$1 limit=$2 drafter=$3; shift 3
  local B="python3 -m treeflash.cli bench --model $HOME/smollm2.gguf --draft-model $drafter --max-tokens 128 --no-plots"
  if [ -f ~/b/$name.json ]; then echo "done $name"; return; fi
  if [ $((END - SECONDS)) -lt $limit ]; then echo "skip $name (left $((END - SECONDS)) s)"; return; fi
  echo "=== $name $(date +%T)"; echo "$B $* --out $name.json" > ~/b/$name.cmd
  timeout -k 5 $limit $B "$@" --out ~/b/$name.json > ~/b/$name.log 2>&1; echo "rc $? $(date +%T)"
  grep -A6 -E '^(humaneval|mtbench) x' ~/b/$name.log | head -8; tar czf $OUT/bench.tgz -C ~ b; }
NEW=$HOME/run/drafter OLD=$HOME/drafter0
ACC="--num-prompts 0 --batch-size 32 --cuda-graph-sizes 32 --methods dflash,ddtree:64"
part acc-mtbench-t0 110 $NEW --dataset mtbench $ACC
part acc-humaneval-t0 130 $NEW --dataset humaneval $ACC
part acc-mtbench-t1 110 $NEW --dataset mtbench --temperature 1 $ACC
part old-mtbench-t0 110 $OLD --dataset mtbench $ACC
part old-humaneval-t0 130 $OLD --dataset humaneval $ACC
part acc-humaneval-t1 130 $NEW --dataset humaneval --temperature 1 $ACC
tar czf $OUT/bench.tgz -C ~ b; ls ~/b
