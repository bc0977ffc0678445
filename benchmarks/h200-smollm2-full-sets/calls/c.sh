#!/bin/bash
# Call C: batch-1 tokens/s on every MT-Bench first turn (T=0), then MT-Bench at T=1 if time is left.
test -f ~/smollm2.gguf || { echo "not warm"; exit 3; }
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1 TREEFLASH_CACHE=$HOME/tfcache TQDM_DISABLE=1
END=$((SECONDS + ${LIMIT:-560}))
bash .stage/g/calls/speed.sh mtbench 0 $((END - SECONDS))
if [ $((END - SECONDS)) -gt 150 ]; then bash .stage/g/calls/speed.sh mtbench 1 $((END - SECONDS)); fi
