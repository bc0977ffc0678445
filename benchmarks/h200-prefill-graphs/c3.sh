#!/bin/bash
# Call 3: stage part 2; synthetic SmolLM2 batch 1 stage split.
test -f ~/stage/q01 || { echo "q01 missing: not warm"; exit 3; }
cp .stage/g4/q02 ~/stage/ || exit 2
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1 TQDM_DISABLE=1; mkdir -p $OUT/c3
timeout 80 python3 -m treeflash.cli bench --synthetic smollm2-135m --context 1024 --batch-methods '1=none,ddtree:64' --rounds 10 --stage-rounds 3 --no-plots --out $OUT/c3/smollm2.json > $OUT/c3/smollm2.log 2>&1; echo "smol rc $?"
python3 -m treeflash.cli bench --replot $OUT/c3/smollm2.json --no-plots 2>/dev/null | tail -5; date
