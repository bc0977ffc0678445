#!/bin/bash
# Ran as call 8 of ../README.md, after prompt lookup became the default on CUDA with a drafter (8 tokens): the engine's default
# (DDTree at the automatic budget, with lookup) against the same without lookup and plain decoding, batch 1,
# every prompt of both sets; then gpu_check E on that code (graphed == eager, greedy == plain decoding;
# its "sdpa ddtree-auto" check now runs with the default lookup). Needs c4.sh's staging (~/stage/part00,
# ~/drafter0) on the same warm machine; carry .stage/b and .whl.
END=$((SECONDS + ${LIMIT:-560}))
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=$PWD:/tmp/site TREEFLASH_CACHE=$HOME/tfcache PYTHONUNBUFFERED=1
if [ ! -f ~/smollm2.gguf ]; then
  test -f ~/stage/part00 || { echo "part00 missing: not warm"; exit 3; }
  cat ~/stage/part00 .stage/b/part01 .stage/b/part02 > ~/smollm2.gguf.xz && xz -d -T8 ~/smollm2.gguf.xz
fi
sha256sum ~/smollm2.gguf | grep -q ^b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53 || { echo "bad gguf"; exit 4; }
mkdir -p ~/b
for set in humaneval mtbench; do
  name=auto-$set-t0
  B="python3 -m treeflash.cli bench --model $HOME/smollm2.gguf --draft-model $HOME/drafter0 --max-tokens 128 --no-plots"
  A="--dataset $set --num-prompts 0 --methods none,ddtree:auto,ddtree:auto/ngram"
  echo "$B $A --out $name.json" > ~/b/$name.cmd; echo "=== $name $(date +%T)"
  timeout -k 5 ${BENCH_LIMIT:-150} $B $A --out ~/b/$name.json > ~/b/$name.log 2>&1; echo "rc $? $(date +%T)"
  grep -A8 -E "^$set x" ~/b/$name.log | head -9; tar czf $OUT/b.tgz -C ~ b
done
left=$((END - SECONDS - 10)); echo "=== gpu_check E ($left s) $(date +%T)"
timeout -k 5 $left python3 scripts/gpu_check.py --sections E --attentions splitkv --out ~/b/gpu_check_e.json \
  > ~/b/gpu_check_e.log 2>&1; echo "rc $? $(date +%T)"; grep -E 'False|rror' ~/b/gpu_check_e.log | head
tail -2 ~/b/gpu_check_e.log; tar czf $OUT/b.tgz -C ~ b
