#!/bin/bash
# Call 3: resume training on the cached responses to the end (final evaluation and export included).
test -f ~/smollm2.gguf || { echo "not warm"; exit 3; }
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1 TREEFLASH_CACHE=$HOME/tfcache TQDM_DISABLE=1
bash .stage/x16/calls/train.sh $((${LIMIT:-560} - SECONDS)) 0
grep -E 'ms/step|eval|resumed|wrote|drafter|done' ~/train_out.log | tail -10; ls ~/run; date
