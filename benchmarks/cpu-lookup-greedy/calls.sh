#!/bin/bash
# The two sampled runs of README.md, one after the other, nothing else running (this 2-core CPU).
for spec in "mtbench 1" "humaneval 0.7"; do
  set -- $spec
  treeflash bench --dataset $1 --num-prompts 10 --max-tokens 128 --temperature $2 --device cpu --no-plots \
    --methods none,ddtree:auto,ddtree:auto/ngram --ngram-tokens 8 --out $1-t$2.json > $1-t$2.log 2>&1
done
