#!/bin/bash
# Call 3: whole Qwen3-8B-shape rounds with the new splitkv kernel and launches, hybrid (the default) then splitkv
# alone, in one process; then gpu_check E (float32 CUDA graphs == eager, greedy == plain) on this code.
export PYTHONPATH=$PWD TQDM_DISABLE=1 PYTHONUNBUFFERED=1
timeout 330 python3 -m treeflash.cli bench --context 1024 --rounds 20 --stage-rounds 2 --no-plots --synthetic qwen3-8b \
  --variants compiled/16/hybrid,compiled/16/splitkv \
  --batch-methods "1=none,ddtree:64,ddtree:256 8=none,ddtree:64 32=none,ddtree:16" --out $OUT/q8-rounds.json \
  > $OUT/q8-rounds.txt 2>&1; echo "rounds rc $?"; grep -E "^ +[0-9]+ |floor|variant" $OUT/q8-rounds.txt | head -30
if [ -f .stage/topk/bench_topk.py ] && [ -f .stage/topk/READY ]; then
  timeout 60 python3 .stage/topk/bench_topk.py --out $OUT/topk.json > $OUT/topk.txt 2>&1; echo "topk rc $?"; tail -30 $OUT/topk.txt
fi
timeout 150 python3 scripts/gpu_check.py --sections E --out $OUT/gpu_check_e.json > $OUT/e.log 2>&1
echo "E rc $?"; tail -3 $OUT/e.log
