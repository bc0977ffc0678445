#!/bin/bash
# The real SmolLM2 GGUF + the shipped drafter at batch 1, T=0, 128 new tokens, the first 40 prompts of each set:
# this tree (the walk and verify mask as Triton kernels) against HEAD before it (.stage/old, 7886a92's
# sources), one process each, interleaved per set: plain decoding, DDTree-64 + 8 lookup tokens and the CUDA
# default (DDTree-auto + lookup), tokens/s against `none` of the same process. Needs stage.sh's staging on the
# same warm machine; carry .stage/b, .stage/old, .stage/k5 and .whl.
END=$((SECONDS + ${LIMIT:-560}))
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export TREEFLASH_CACHE=$HOME/tfcache PYTHONUNBUFFERED=1
if [ ! -f ~/smollm2.gguf ]; then
  test -f ~/stage/part00 || { echo "part00 missing: not warm"; exit 3; }
  cat ~/stage/part00 .stage/b/part01 .stage/b/part02 > ~/smollm2.gguf.xz && xz -d -T8 ~/smollm2.gguf.xz
fi
sha256sum ~/smollm2.gguf | grep -q ^b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53 || { echo "bad gguf"; exit 4; }
mkdir -p ~/r; ROOT=$PWD
IFS=';' read -ra SETS <<< "${RUNS:-humaneval 0;mtbench 0}"
for run in "${SETS[@]}"; do
  set -- $run
  for code in new old; do
    name=$code-$1-t$2
    case $code in new) dir=$ROOT;; old) dir=$ROOT/.stage/old;; esac
    left=$((END - SECONDS - 5)); [ $left -lt 40 ] && { echo "skip $name"; continue; }
    A="--model $HOME/smollm2.gguf --draft-model $HOME/drafter0 --max-tokens 128 --no-plots --dataset $1 --temperature $2 --num-prompts 40 --methods none,ddtree:64/ngram,ddtree:auto/ngram --ngram-tokens 8"
    echo "python3 -m treeflash.cli bench $A --out $name.json" | sed "s#$HOME#~#g" > ~/r/$name.cmd; echo "=== $name $(date +%T)"
    (cd $dir && PYTHONPATH=$dir:/tmp/site timeout -k 5 $left python3 -m treeflash.cli bench $A --out ~/r/$name.json > ~/r/$name.log 2>&1)
    echo "rc $? $(date +%T)"; grep -A7 -E "^$1 x" ~/r/$name.log | head -8; tar czf $OUT/r.tgz -C ~ r
  done
done
