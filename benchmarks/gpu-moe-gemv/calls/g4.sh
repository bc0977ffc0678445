#!/bin/bash
# The gemv plan as landed (launch 8,1024,16,256,4; with the grouped product for N k <= E / 4, else N k <= 2 E) against the code before it, the
# Qwen3-30B-A3B shape's rounds (random bf16 weights, context 1,024, batch 1, 4 and 8), old (7679b65's treeflash/, run
# from inside .stage/old: `python -m` puts the working directory first on the path) then new; check.py first.
export PYTHONUNBUFFERED=1 TQDM_DISABLE=1
END=$((SECONDS + ${LIMIT:-580}))
nvidia-smi -L; date
mkdir -p $HOME/g4
PYTHONPATH=$PWD timeout -k 5 100 python3 benchmarks/gpu-moe/check.py --out $HOME/g4/check.json > $HOME/g4/check.log 2>&1; echo "check rc $?"
grep '"ok"' $HOME/g4/check.log; tar czf $OUT/g4.tgz -C $HOME g4
CMD="python3 -m treeflash.cli bench --synthetic qwen3-30b-a3b --context 1024 --rounds 20 --stage-rounds 2 --no-plots --batch-sizes 1,4,8 --methods none,dflash,ddtree:16"
for who in old new; do
  left=$((END - SECONDS - 10)); [ $left -lt 40 ] && break
  dir=$PWD; [ $who = old ] && dir=$PWD/.stage/old
  echo "(cd $([ $who = old ] && echo .stage/old || echo .) && $CMD --out $who.json)" > $HOME/g4/$who.cmd
  (cd $dir && timeout -k 5 $left $CMD --out $HOME/g4/$who.json > $HOME/g4/$who.log 2>&1); echo "$who rc $?"
  grep -A10 "^qwen3-30b-a3b" $HOME/g4/$who.log | head -10; tar czf $OUT/g4.tgz -C $HOME g4
done
date
