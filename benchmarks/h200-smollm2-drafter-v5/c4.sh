#!/bin/bash
# Call 4: join the blob (GGUF, v4 data cache, ShareGPT + code prompts), convert, train-drafter: data
# (resumes the v4 cache: the rest of ShareGPT + the code completions) then the first part of training.
S=$SECONDS
test -f ~/stage/p02 || { echo "p02 missing: not warm"; exit 3; }
cat ~/stage/p00 ~/stage/p01 ~/stage/p02 .stage/g5/p03 > ~/blob.tar
sha256sum ~/blob.tar | grep -q ^4293b58c581e58900523b4e93ba57fc2ace72a3401b6d77ac3bedcca03ac18a1 || { echo "bad blob sha256"; exit 4; }
tar xf ~/blob.tar -C ~/stage && rm ~/blob.tar && mv ~/stage/smollm2.gguf ~/ && tar xzf ~/stage/v4-data.tgz -C ~ || exit 5
sha256sum ~/smollm2.gguf | grep -q ^b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53 || { echo "bad gguf sha256"; exit 4; }
wc -l ~/data/*.jsonl
export PYTHONPATH=$PWD:/tmp/site TREEFLASH_CACHE=$HOME/tfcache
python3 -m treeflash.cli convert ~/smollm2.gguf 2>&1 | tail -1
bash .stage/chain4/train.sh $((565 - SECONDS + S)) 6
grep -E 'data|ms/step|eval|resumed|vocab' ~/train_out.log | tail -30; ls ~/ckpt; wc -l ~/data/*.jsonl; date
