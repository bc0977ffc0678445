#!/bin/bash
# Call C: join the GGUF; train the SmolLM2 drafter (data + training + held-out evaluation) into ~/run.
test -f ~/stage/p01 || { echo "p01 missing: not warm"; exit 3; }
cat ~/stage/p00 ~/stage/p01 .stage/g3/p02 > ~/smollm2.gguf
sha256sum ~/smollm2.gguf | grep -q ^b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53 || { echo "bad sha256"; exit 4; }
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1 TREEFLASH_CACHE=$HOME/tfcache
python3 -m treeflash.cli convert ~/smollm2.gguf 2>&1 | tail -2
timeout ${TRAIN_TIMEOUT:-500} python3 -m treeflash.cli train-drafter --target ~/smollm2.gguf --out ~/run \
  --prompts ~/stage/prompts.jsonl.gz --data-dir ~/data --checkpoint-dir ~/ckpt $TRAIN_ARGS 2>&1 | grep --line-buffered -v Warning
echo "exit ${PIPESTATUS[0]}"
mkdir -p $OUT/run/drafter && cp ~/run/drafter/* $OUT/run/drafter/ && cp ~/run/history.json ~/run/train.log ~/run/*.png $OUT/run/
ls -la ~/run ~/run/drafter; du -sh ~/data; date
