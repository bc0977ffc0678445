#!/bin/bash
# Speed call 2: join the blob, convert, then batch-1 speed of the thirteenth drafter (24 prompts, T=0) on
# MT-Bench, then HumanEval if time is left ($END: $SECONDS deadline).
test -f ~/stage/p1 || { echo "p1 missing: not warm"; exit 3; }
END=$((SECONDS + ${LIMIT:-200}))
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
cat ~/stage/p1 .stage/d10b/p2 > ~/blob.tar
sha256sum ~/blob.tar | grep -q ^3f5720f1424cc3fd9a981700846a9d4d6fd9bcb3312e25877baa438f9835448d || { echo "bad blob"; exit 4; }
tar xf ~/blob.tar -C ~/stage && xz -d -T8 ~/stage/smollm2.gguf.xz && mv ~/stage/smollm2.gguf ~/ || exit 5
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1 TREEFLASH_CACHE=$HOME/tfcache TQDM_DISABLE=1
python3 -m treeflash.cli convert ~/smollm2.gguf 2>&1 | tail -1
mkdir -p $OUT/b
for set in mtbench humaneval; do
  L=$((END - SECONDS)); if [ $L -lt 60 ]; then echo "skip $set ($L s left)"; continue; fi
  C="python3 -m treeflash.cli bench --model $HOME/smollm2.gguf --draft-model $HOME/d13 --max-tokens 128 --no-plots --dataset $set --num-prompts 24 --methods none,dflash,ddtree:32,ddtree:64"
  echo "$C --out speed-$set-t0.json" > $OUT/b/speed-$set-t0.cmd; echo "=== $set $(date +%T), limit $L s"
  timeout -k 5 $L $C --out $OUT/b/speed-$set-t0.json > $OUT/b/speed-$set-t0.log 2>&1; echo "rc $?"
  grep -A7 -E "^$set x" $OUT/b/speed-$set-t0.log
done
