#!/bin/bash
# Call 10: join the blob (p09 carried), check, unpack, convert the GGUF, then train (first part, ~540 s).
test -f ~/stage/p08 || { echo "p08 missing: not warm"; exit 3; }
cat ~/stage/p0[0-8] .stage/g9/p09 > ~/blob.tar
sha256sum ~/blob.tar | grep -q ^bf9169344c3fd9c0525149b11cdfaaf444047ef9e9cf46ce4284d5156ff8f648 || { echo "bad blob sha256"; exit 4; }
tar xf ~/blob.tar -C ~/stage && rm ~/blob.tar ~/stage/p0* && mv ~/stage/smollm2.gguf ~/ && tar xzf ~/stage/v6-data.tgz -C ~ || exit 5
sha256sum ~/smollm2.gguf | grep -q ^b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53 || { echo "bad gguf sha256"; exit 4; }
wc -l ~/data/*.jsonl
export PYTHONPATH=$PWD:/tmp/site TREEFLASH_CACHE=$HOME/tfcache
python3 -m treeflash.cli convert ~/smollm2.gguf 2>&1 | tail -1
bash .stage/chain11/train.sh ${LIMIT:-540}
grep -E 'data|ms/step|eval|resumed|vocab|initialised' ~/train_out.log | tail -12; ls ~/ckpt; date
