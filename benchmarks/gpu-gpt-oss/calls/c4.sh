#!/bin/bash
# Call 4: splits sized to the window against the capacity's (window_splits.py), then the GPT-OSS-20B shape's
# rounds again with the window-sized splits (call 1 ran them with the capacity's), and at context 8,192.
export PYTHONPATH=$PWD TQDM_DISABLE=1 PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
timeout 120 python3 benchmarks/gpu-gpt-oss/calls/window_splits.py $OUT/window_splits.json > $OUT/window_splits.txt 2>&1
echo "window_splits rc $?"; cat $OUT/window_splits.txt | tail -8 | cut -c1-300
for ctx in 1024 8192; do
timeout 150 python3 -m treeflash.cli bench --synthetic gpt-oss-20b --context $ctx --rounds 20 --stage-rounds 2 \
  --no-plots --batch-methods "1=none,dflash,ddtree:16,ddtree:64" --out $OUT/oss20b_$ctx.json \
  > $OUT/oss20b_$ctx.txt 2>&1; echo "bench $ctx rc $?"; grep -aE "^ +[0-9]+ |floor|rror" $OUT/oss20b_$ctx.txt | head -8
done
