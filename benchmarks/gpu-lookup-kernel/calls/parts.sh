#!/bin/bash
# Ran in calls 3, 4 and 6 (see ../README.md).
# Runs the named parts (bench runs, gpu_check) until the call's deadline ($LIMIT s from the start), skipping
# a part already done or one whose own limit no longer fits; results and logs accumulate in ~/b and are
# archived to $OUT/b.tgz after each part. Needs the GGUF at ~/smollm2.gguf (assembled here if only the
# parts are staged), the shipped drafter at ~/drafter0 and, for new-*, the new drafter at ~/run/drafter.
END=$((SECONDS + ${LIMIT:-570}))
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=$PWD:/tmp/site TREEFLASH_CACHE=$HOME/tfcache
if [ ! -f ~/smollm2.gguf ]; then
  test -f ~/stage/part00 || { echo "part00 missing: not warm"; exit 3; }
  cat ~/stage/part00 .stage/b/part01 .stage/b/part02 > ~/smollm2.gguf.xz && xz -d -T8 ~/smollm2.gguf.xz
fi
sha256sum ~/smollm2.gguf | grep -q ^b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53 || { echo "bad gguf"; exit 4; }
mkdir -p ~/b
bench() { local name=$1 limit=$2 drafter=$3; shift 3
  local B="python3 -m treeflash.cli bench --model $HOME/smollm2.gguf --draft-model $drafter --max-tokens 128 --no-plots"
  if [ -f ~/b/$name.json ]; then echo "done $name"; return; fi
  if [ $((END - SECONDS)) -lt $limit ]; then echo "skip $name (left $((END - SECONDS)) s)"; return; fi
  echo "=== $name $(date +%T)"; echo "$B $* --out $name.json" > ~/b/$name.cmd
  timeout -k 5 $limit $B "$@" --out ~/b/$name.json > ~/b/$name.log 2>&1; echo "rc $? $(date +%T)"
  grep -A9 -E '^(humaneval|mtbench) x' ~/b/$name.log | head -11; tar czf $OUT/b.tgz -C ~ b; }
ACC="--num-prompts 0 --batch-size 32 --cuda-graph-sizes 32"
LOOK="--methods dflash,dflash/ngram,ddtree:64,ddtree:64/ngram"
NEW="--methods dflash,ddtree:64"
SPD="--num-prompts 0 --methods none,none/ngram,ddtree:64,ddtree:64/ngram"
for p in "$@"; do case $p in
  check) if [ -f ~/b/gpu_check.json ]; then echo "done check"; continue; fi
         echo "=== gpu_check $(date +%T)"
         timeout -k 5 200 python3 scripts/gpu_check.py --sections TCEF --attentions splitkv --out ~/b/gpu_check.json \
           > ~/b/gpu_check.log 2>&1; echo "rc $? $(date +%T)"; grep -E 'False|error|Error|sync inside' ~/b/gpu_check.log | head -20
         python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print({k: (sum(v is True for v in s.values()), len(s)) for k, s in d.items() if isinstance(s, dict)})" ~/b/gpu_check.json
         tar czf $OUT/b.tgz -C ~ b;;
  speed-humaneval-t0) bench $p 200 ~/drafter0 --dataset humaneval $SPD;;
  speed-mtbench-t0) bench $p 200 ~/drafter0 --dataset mtbench $SPD;;
  speed-mtbench-t1) bench $p 200 ~/drafter0 --dataset mtbench --temperature 1 --num-prompts 0 --methods none,ddtree:64,ddtree:64/ngram;;
  speed32-mtbench-t0) bench $p 200 ~/drafter0 --dataset mtbench --batch-size 32 --cuda-graph-sizes 32 $SPD;;
  look-humaneval-t0) bench $p 130 ~/drafter0 --dataset humaneval $ACC $LOOK;;
  look-mtbench-t0) bench $p 110 ~/drafter0 --dataset mtbench $ACC $LOOK;;
  look-mtbench-t1) bench $p 110 ~/drafter0 --dataset mtbench --temperature 1 $ACC $LOOK;;
  new-humaneval-t0) bench $p 110 ~/run/drafter --dataset humaneval $ACC $NEW;;
  new-mtbench-t0) bench $p 100 ~/run/drafter --dataset mtbench $ACC $NEW;;
  new-mtbench-t1) bench $p 100 ~/run/drafter --dataset mtbench --temperature 1 $ACC $NEW;;
  *) echo "unknown part $p";;
esac; done
tar czf $OUT/b.tgz -C ~ b; ls ~/b
