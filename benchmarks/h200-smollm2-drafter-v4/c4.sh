#!/bin/bash
# Call 4: join the GGUF, convert, train-drafter: 5 more minutes of data, then the first part of training.
S=$SECONDS
test -f ~/stage/q02 || { echo "q02 missing: not warm"; exit 3; }
cat ~/stage/q00 ~/stage/q01 ~/stage/q02 .stage/g4/q03 > ~/smollm2.gguf
sha256sum ~/smollm2.gguf | grep -q ^b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53 || { echo "bad sha256"; exit 4; }
export PYTHONPATH=$PWD:/tmp/site TREEFLASH_CACHE=$HOME/tfcache
python3 -m treeflash.cli convert ~/smollm2.gguf 2>&1 | tail -1
bash .stage/chain3/train.sh $((535 - SECONDS + S)) 4
grep -E 'data|ms/step|eval|captured|prefill' ~/train_out.log | tail -30; ls ~/ckpt; date
