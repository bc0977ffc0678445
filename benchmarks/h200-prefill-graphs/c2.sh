#!/bin/bash
# Call 2: stage part 1, the prompts and the v3 data; synthetic Qwen3-8B: batch 1 stage split, batch 8/32 auto.
test -f ~/stage/q00 || { echo "q00 missing: not warm"; exit 3; }
cp .stage/g4/q01 .stage/train/prompts.jsonl.gz ~/stage/ && tar xzf .stage/train/v3-data.tgz -C ~ || exit 2
ls ~/data | head; export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1 TQDM_DISABLE=1; mkdir -p $OUT/c2
timeout 300 python3 -m treeflash.cli bench --synthetic qwen3-8b --context 1024 --rounds 5 --stage-rounds 2 --no-plots \
  --batch-methods '1=none,ddtree:64,ddtree:256 8=none,ddtree:16,ddtree:32,ddtree:64,ddtree:auto 32=none,ddtree:8,ddtree:16,ddtree:32,ddtree:auto' --out $OUT/c2/qwen3-8b.json > $OUT/c2/qwen3-8b.log 2>&1; echo "q8 rc $?"
python3 -m treeflash.cli bench --replot $OUT/c2/qwen3-8b.json --no-plots 2>/dev/null | tail -9; date
