#!/bin/bash
# Call 2: the engine's CUDA default (DDTree at the automatic budget + 8 lookup tokens), and DDTree-64 with lookup
# for reference, before and after the budget chooser counted what every smaller budget accepted in the same
# round (budget.accepted_within), interleaved per set in one call: "old" is the commit before (staged as
# .stage/old/treeflash, run from there), "new" this tree. Batch 1, the real SmolLM2-135M-Instruct GGUF and the
# shipped drafter, 128 new tokens, the first 40 prompts of each set. Needs stage.sh's staging on the same warm
# machine; carry .stage/b, .stage/old and .whl.
END=$((SECONDS + ${LIMIT:-560}))
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export TREEFLASH_CACHE=$HOME/tfcache PYTHONUNBUFFERED=1
if [ ! -f ~/smollm2.gguf ]; then
  test -f ~/stage/part00 || { echo "part00 missing: not warm"; exit 3; }
  cat ~/stage/part00 .stage/b/part01 .stage/b/part02 > ~/smollm2.gguf.xz && xz -d -T8 ~/smollm2.gguf.xz
fi
sha256sum ~/smollm2.gguf | grep -q ^b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53 || { echo "bad gguf"; exit 4; }
mkdir -p ~/b; ROOT=$PWD
for run in "mtbench 1" "humaneval 0" "mtbench 0"; do
  set -- $run
  for code in new old; do
    name=$code-$1-t$2
    if [ $code = new ]; then dir=$ROOT; else dir=$ROOT/.stage/old; fi
    left=$((END - SECONDS - 5)); [ $left -lt 40 ] && { echo "skip $name"; continue; }
    A="--model $HOME/smollm2.gguf --draft-model $HOME/drafter0 --max-tokens 128 --no-plots --dataset $1 --temperature $2 --num-prompts 40 --methods none,ddtree:auto/ngram,ddtree:64/ngram --ngram-tokens 8"
    echo "python3 -m treeflash.cli bench $A --out $name.json" > ~/b/$name.cmd; echo "=== $name $(date +%T)"
    (cd $dir && PYTHONPATH=$dir:/tmp/site timeout -k 5 $left python3 -m treeflash.cli bench $A --out ~/b/$name.json > ~/b/$name.log 2>&1)
    echo "rc $? $(date +%T)"; grep -A7 -E "^$1 x" ~/b/$name.log | head -8; tar czf $OUT/b.tgz -C ~ b
  done
done
