#!/bin/bash
# Call 5 (LIMIT=400): c4.sh turned by `sed` in the call itself into the same four benches of the ninth drafter
# (~/drafter0, the shipped one) on the same machine, named v9-*.
test -f ~/drafter0/config.json || exit 3
END=$((SECONDS + ${LIMIT:-540}))
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1 TREEFLASH_CACHE=$HOME/tfcache TQDM_DISABLE=1
mkdir -p ~/b
part() { local name=$1 limit=$2 drafter=$3; shift 3
  local B="python3 -m treeflash.cli bench --model $HOME/smollm2.gguf --draft-model $drafter --max-tokens 128 --no-plots"
  if [ $((END - SECONDS)) -lt $limit ]; then echo "skip $name (left $((END - SECONDS)) s)"; return; fi
  echo "=== $name $(date +%T)"; echo "$B $* --out $name.json" > ~/b/$name.cmd
  timeout -k 5 $limit $B "$@" --out ~/b/$name.json > ~/b/$name.log 2>&1; echo "rc $? $(date +%T)"
  grep -A6 -E '^(humaneval|mtbench) x' ~/b/$name.log | head -8; tar czf $OUT/bench.tgz -C ~ b; }
NEW=$HOME/drafter0
ACC="--num-prompts 0 --batch-size 32 --cuda-graph-sizes 32 --methods dflash,ddtree:64"
part v9-mtbench-t0 100 $NEW --dataset mtbench $ACC
part v9-humaneval-t0 120 $NEW --dataset humaneval $ACC
part v9-mtbench-t1 100 $NEW --dataset mtbench --temperature 1 $ACC
part v9-humaneval-t1 120 $NEW --dataset humaneval --temperature 1 $ACC
tar czf $OUT/bench.tgz -C ~ b; ls ~/b
