#!/bin/bash
# Call 2: tokens/s after the graph-pool change, A/B in one call: HEAD against 2e21f57's treeflash (.stage/base,
# a stream and pool per capture), synthetic rounds back to back, ABBA per shape.
export PYTHONUNBUFFERED=1 TQDM_DISABLE=1 TRITON_CACHE_DIR=$HOME/tf/triton
one() {  # one NAME DIR SHAPE ROUNDS LIMIT
  mkdir -p $OUT/$3
  CMD="python3 -m treeflash.cli bench --synthetic $3 --context 1024 --rounds $4 --stage-rounds 0 --no-plots --batch-sizes 1 --methods none,ddtree:64"
  echo "$CMD --out $1.json" > $OUT/$3/cmd.txt
  (cd $2 && PYTHONPATH=$2 timeout $5 $CMD --out $OUT/$3/$1.json 2>&1 | grep -v -i warn > $OUT/$3/$1.log)
  echo "== $3 $1 rc $? $(date +%T)"; grep -E "^ +1 " $OUT/$3/$1.log
}
one new1 $PWD smollm2-135m 200 110
one base1 $PWD/.stage/base smollm2-135m 200 110
one base2 $PWD/.stage/base smollm2-135m 200 80
one new2 $PWD smollm2-135m 200 80
one new1 $PWD qwen3-8b 40 110
one base1 $PWD/.stage/base qwen3-8b 40 110
