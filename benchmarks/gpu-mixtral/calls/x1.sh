#!/bin/bash
# The Mixtral-8x7B shape's rounds (random bf16 weights, 93 GB: an H200), context 1,024, batch 1 and 8: our AR step
# against the floor of the bytes a token reads (2 of 8 experts), the chain and DDTree rounds; then, time left,
# the Qwen3-30B-A3B shape's on the same GPU.
export PYTHONUNBUFFERED=1 TQDM_DISABLE=1 PYTHONPATH=$PWD
END=$((SECONDS + ${LIMIT:-300}))
nvidia-smi -L; date; mkdir -p $HOME/x
for s in mixtral-8x7b qwen3-30b-a3b; do
  left=$((END - SECONDS - 10)); [ $left -lt 60 ] && break
  CMD="python3 -m treeflash.cli bench --synthetic $s --context 1024 --rounds 20 --stage-rounds 2 --no-plots --batch-sizes 1,8 --methods none,dflash,ddtree:16,ddtree:64"
  echo "$CMD --out $s.json" > $HOME/x/$s.cmd
  timeout -k 5 $left $CMD --out $HOME/x/$s.json > $HOME/x/$s.log 2>&1; echo "$s rc $?"
  grep -A10 "^$s" $HOME/x/$s.log | head -10; tail -3 $HOME/x/$s.log; tar czf $OUT/x.tgz -C $HOME x
done
date
