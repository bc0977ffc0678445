#!/bin/bash
# Call 5: join the blob (GGUF, v4 data cache, sharegpt-all + code prompts), convert, regenerate the
# responses missing from the cache (the fifth run's new ones were not brought back, and the later
# ShareGPT turns are new), send the whole cache back in <16 MiB pieces, then start training.
S=$SECONDS
test -f ~/stage/p03 || { echo "p03 missing: not warm"; exit 3; }
cat ~/stage/p00 ~/stage/p01 ~/stage/p02 ~/stage/p03 .stage/g6/p04 > ~/blob.tar
sha256sum ~/blob.tar | grep -q ^e19ac68970572f1677f4ce875d5857060ba2f920dca4d9a61c9f275c77d7ba8a || { echo "bad blob sha256"; exit 4; }
tar xf ~/blob.tar -C ~/stage && rm ~/blob.tar ~/stage/p0* && mv ~/stage/smollm2.gguf ~/ && tar xzf ~/stage/v4-data.tgz -C ~ || exit 5
sha256sum ~/smollm2.gguf | grep -q ^b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53 || { echo "bad gguf sha256"; exit 4; }
export PYTHONPATH=$PWD:/tmp/site TREEFLASH_CACHE=$HOME/tfcache
python3 -m treeflash.cli convert ~/smollm2.gguf 2>&1 | tail -1
# Beside the data stage (a correctness check, not a timing): CUDA graphs == eager with the tree kernel.
(TQDM_DISABLE=1 timeout 300 python3 scripts/gpu_check.py --sections E --attentions splitkv --out $OUT/gpu_check_e.json > $OUT/gpu_check_e.log 2>&1; echo "E rc $?" >> $OUT/gpu_check_e.log) &
# Data only in this call: the timeout ends it after the data stage, before the first checkpoint, so
# training (and its --train-minutes step count) starts in the next call.
bash .stage/chain7/train.sh $((440 - SECONDS + S)) 5.5
wait; tail -2 $OUT/gpu_check_e.log; wc -l ~/data/*.jsonl; tar czf - -C ~ data | split -b 15000000 -d - $OUT/data.tgz.; ls -la $OUT; date
