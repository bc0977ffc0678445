#!/bin/bash
# Call 2: wheels; join the blob (p2 carried), check, unpack, convert the GGUF; write the own prompts, generate
# responses for $DATA minutes, then train until the call's limit (checkpoints every 200 steps).
test -f ~/stage/p1 || { echo "p1 missing: not warm"; exit 3; }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
cat ~/stage/p1 .stage/x15/b/p2 > ~/blob.tar
sha256sum ~/blob.tar | grep -q ^07040c17457e20900854d5ece2856cb9a71c9121c95eecbb3d807e5d552081df || { echo "bad blob sha256"; exit 4; }
tar xf ~/blob.tar -C ~/stage && rm ~/blob.tar ~/stage/p1 && xz -d -T8 ~/stage/smollm2.gguf.xz && mv ~/stage/smollm2.gguf ~/ || exit 5
sha256sum ~/smollm2.gguf | grep -q ^b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53 || { echo "bad gguf sha256"; exit 4; }
export PYTHONPATH=$PWD:/tmp/site TREEFLASH_CACHE=$HOME/tfcache
python3 -m treeflash.cli convert ~/smollm2.gguf 2>&1 | tail -1
bash .stage/x16/calls/train.sh $((${LIMIT:-560} - SECONDS)) ${DATA:-4.5}
grep -E 'data|ms/step|eval|resumed|vocab|initialised|own prompts: only' ~/train_out.log | tail -14; ls ~/ckpt ~/data; date
