#!/bin/bash
# Call 4: the last program merges only where a row block has at most 2 splits (the Qwen3-8B 65-node tree); rounds
# A/B against HEAD's treeflash (.stage/head), ABBA at Qwen3-8B, one pair at SmolLM2 (unchanged there: 16+ splits).
export PYTHONUNBUFFERED=1 TQDM_DISABLE=1 TRITON_CACHE_DIR=$HOME/tf/triton
nvidia-smi -L; date
one() {  # one NAME DIR SHAPE ROUNDS LIMIT
  mkdir -p $OUT/ab2/$3
  CMD="python3 -m treeflash.cli bench --synthetic $3 --context 1024 --rounds $4 --stage-rounds 0 --no-plots --batch-sizes 1 --methods none,ddtree:64"
  echo "$CMD --out $1.json" > $OUT/ab2/$3/cmd.txt
  (cd $2 && PYTHONPATH=$2 timeout $5 $CMD --out $OUT/ab2/$3/$1.json 2>&1 | grep -v -i warn > $OUT/ab2/$3/$1.log)
  echo "== $3 $1 rc $? $(date +%T)"; grep -E "^ +1 " $OUT/ab2/$3/$1.log
}
one new1 $PWD qwen3-8b 60 120
one head1 $PWD/.stage/head qwen3-8b 60 80
one head2 $PWD/.stage/head qwen3-8b 60 80
one new2 $PWD qwen3-8b 60 80
one new1 $PWD smollm2-135m 200 80
one head1 $PWD/.stage/head smollm2-135m 200 60
(cd $OUT && tar czf ab2.tgz ab2 && rm -r ab2)
