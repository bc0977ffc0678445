#!/bin/bash
# The automatic budget with and without the host's time per round in every budget's cost, interleaved per set in
# one call: "old" is fb65c82's sources (.stage/old), "ovh" the same plus benchmarks/lookup-chooser-seen/
# overhead-only.patch (`BudgetChooser.charge`: each graphed round's wall time beyond its replay's cost, averaged
# and added to every budget's cost; .stage/ovh). The engine's CUDA default (DDTree-auto + 8 lookup tokens) and
# DDTree-64 + lookup for reference, against `none` of the same process. Batch 1, the real SmolLM2 GGUF and the
# shipped drafter, 128 new tokens, the first 40 prompts of each set. RUNS picks the sets ("set temperature;...").
# Needs stage.sh's staging on the same warm machine; carry .stage/b, .stage/old, .stage/ovh and .whl.
END=$((SECONDS + ${LIMIT:-560}))
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export TREEFLASH_CACHE=$HOME/tfcache PYTHONUNBUFFERED=1
if [ ! -f ~/smollm2.gguf ]; then
  test -f ~/stage/part00 || { echo "part00 missing: not warm"; exit 3; }
  cat ~/stage/part00 .stage/b/part01 .stage/b/part02 > ~/smollm2.gguf.xz && xz -d -T8 ~/smollm2.gguf.xz
fi
sha256sum ~/smollm2.gguf | grep -q ^b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53 || { echo "bad gguf"; exit 4; }
mkdir -p ~/b; ROOT=$PWD
IFS=';' read -ra SETS <<< "${RUNS:-mtbench 1;humaneval 0;mtbench 0}"
for run in "${SETS[@]}"; do
  set -- $run
  for code in ovh old; do
    name=$code-$1-t$2
    dir=$ROOT/.stage/$code
    left=$((END - SECONDS - 5)); [ $left -lt 40 ] && { echo "skip $name"; continue; }
    A="--model $HOME/smollm2.gguf --draft-model $HOME/drafter0 --max-tokens 128 --no-plots --dataset $1 --temperature $2 --num-prompts 40 --methods none,ddtree:auto/ngram,ddtree:64/ngram --ngram-tokens 8"
    echo "python3 -m treeflash.cli bench $A --out $name.json" > ~/b/$name.cmd; echo "=== $name $(date +%T)"
    (cd $dir && PYTHONPATH=$dir:/tmp/site timeout -k 5 $left python3 -m treeflash.cli bench $A --out ~/b/$name.json > ~/b/$name.log 2>&1)
    echo "rc $? $(date +%T)"; grep -A7 -E "^$1 x" ~/b/$name.log | head -8; tar czf $OUT/b.tgz -C ~ b
  done
done
