#!/bin/bash
# Call C: join the GGUF, convert it, then train-drafter: data (3 min) and the first part of training.
S=$SECONDS
test -f ~/stage/p01 || { echo "p01 missing: not warm"; exit 3; }
cat ~/stage/p00 ~/stage/p01 .stage/g3/p02 > ~/smollm2.gguf
sha256sum ~/smollm2.gguf | grep -q ^b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53 || { echo "bad sha256"; exit 4; }
export PYTHONPATH=$PWD:/tmp/site TREEFLASH_CACHE=$HOME/tfcache
python3 -m treeflash.cli convert ~/smollm2.gguf 2>&1 | tail -1
bash .stage/chain2/train.sh $((575 - SECONDS + S)) 3
grep -E 'data|ms/step|eval|captured' ~/train_out.log | tail -30; ls ~/ckpt; date
