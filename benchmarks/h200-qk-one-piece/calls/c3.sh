#!/bin/bash
# Call 3 (main + the one-reduction q/k piece, no fused merge): batches 1, 8 and 32 at the Qwen3-8B shape, main's two
# pieces (twopiece.py) then the one piece, and where the AR step's and the DDTree-64 round's time goes.
export PYTHONPATH=$PWD TQDM_DISABLE=1 PYTHONUNBUFFERED=1
B=(-m treeflash.cli bench --context 1024 --rounds 20 --stage-rounds 3 --no-plots --synthetic qwen3-8b
   --variants compiled/16/hybrid --batch-methods "1=none,ddtree:64,ddtree:256 8=none,ddtree:64 32=none,ddtree:16")
timeout 170 python3 .stage/fm/twopiece.py "${B[@]}" --out $OUT/q8-batches-two.json 2>&1 | grep -E "^ +[0-9]+ " | head -8
timeout 170 python3 "${B[@]}" --out $OUT/q8-batches-one.json 2>&1 | grep -E "^ +[0-9]+ " | head -8
timeout 150 python3 benchmarks/kernel_profile.py --shape qwen3-8b --methods none,ddtree:64 --context 1024 --rounds 10 \
  --rows 30 --modes graphs --out $OUT/prof-qwen3-8b-one-piece.txt > ~/p.log 2>&1; echo "prof rc $?"
grep -A8 "==" $OUT/prof-qwen3-8b-one-piece.txt | cut -c1-110
