#!/bin/bash
# Call 2: wheels; join the blob (p2 carried), check, unpack, convert the GGUF; generate responses for
# $DATA minutes, then train until the call's limit (checkpoints every 200 steps).
test -f ~/stage/p1 || { echo "p1 missing: not warm"; exit 3; }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
cat ~/stage/p1 .stage/d10b/p2 > ~/blob.tar
sha256sum ~/blob.tar | grep -q ^3f5720f1424cc3fd9a981700846a9d4d6fd9bcb3312e25877baa438f9835448d || { echo "bad blob sha256"; exit 4; }
tar xf ~/blob.tar -C ~/stage && rm ~/blob.tar ~/stage/p1 && xz -d -T8 ~/stage/smollm2.gguf.xz && mv ~/stage/smollm2.gguf ~/ || exit 5
sha256sum ~/smollm2.gguf | grep -q ^b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53 || { echo "bad gguf sha256"; exit 4; }
cp .stage/x12/code-prompts-all.jsonl.gz ~/stage/ || exit 5
export PYTHONPATH=$PWD:/tmp/site TREEFLASH_CACHE=$HOME/tfcache
python3 -m treeflash.cli convert ~/smollm2.gguf 2>&1 | tail -1
bash .stage/x13/calls/train.sh $((${LIMIT:-585} - SECONDS)) ${DATA:-7}
grep -E 'data|ms/step|eval|resumed|vocab|initialised' ~/train_out.log | tail -12; ls ~/ckpt ~/data; date
