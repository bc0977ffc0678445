#!/bin/bash
# Call 2: the landed kernel (exp2, whole tiles unmasked) and launches: float32 compiles and matches; splitkv
# (launch_for) against main's module and FlexAttention at batches 1, 8, 32.
export PYTHONPATH=$PWD TQDM_DISABLE=1 PYTHONUNBUFFERED=1
timeout 100 python3 .stage/skv2/f32check.py > $OUT/f32check.txt 2>&1; echo "f32 rc $?"; tail -2 $OUT/f32check.txt
timeout 420 python3 benchmarks/splitkv_ab.py --baseline .stage/skv2/skv_main.py --launches 1 \
  --shapes qwen3-8b,smollm2-135m --batches 1,8,32 --new-tokens 1,16,17,65,257 --out $OUT/skv_ab.json \
  > $OUT/skv_ab.txt 2>&1; echo "ab rc $?"; cat $OUT/skv_ab.txt | cut -c1-150
