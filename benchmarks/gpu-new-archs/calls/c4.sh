#!/bin/bash
# Call 4 (the last of the session's device time, the machine still warm): the three shapes' rounds with the time
# the compiles need (c1.sh's 60 s a shape were cut after DDTree-16), Gemma 3 1B through splitkv.
export PYTHONPATH=$PWD TQDM_DISABLE=1 PYTHONUNBUFFERED=1
for shape in gemma3-1b smollm3-3b phi4-mini; do
  variants=$([ $shape = gemma3-1b ] && echo "--variants compiled/16/splitkv")
  timeout 120 python3 -m treeflash.cli bench --synthetic $shape --context 1024 --rounds 20 --stage-rounds 2 $variants \
    --no-plots --batch-methods "1=none,dflash,ddtree:16,ddtree:64" --out $OUT/$shape.json \
    > $OUT/$shape.log 2>&1; echo "$shape rc $?"
  grep -aE "per round|floor" $OUT/$shape.log | head -8
done
