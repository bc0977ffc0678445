#!/bin/bash
# Call 6: the vocab-row kernels against torch's; the kernel profile and whole Qwen3-8B-shape rounds of this code
# (batch 1, 8, 32); gpu_check E (splitkv: float32 graphs == eager, greedy == plain decoding).
export PYTHONPATH=$PWD TQDM_DISABLE=1 PYTHONUNBUFFERED=1
timeout 90 python3 .stage/cold/lsm_ab.py (calls/vocab_rows_ab.py) $OUT/vocab_rows.json > $OUT/vocab_rows.txt 2>&1; echo "rows rc $?"
cut -c1-220 $OUT/vocab_rows.txt
timeout 120 python3 benchmarks/kernel_profile.py --shape qwen3-8b --methods none,dflash,ddtree:64,ddtree:256 \
  --context 1024 --rounds 10 --rows 45 --modes graphs --out $OUT/prof.txt > /dev/null 2>&1; echo "prof rc $?"
grep "==" $OUT/prof.txt
timeout 250 python3 -m treeflash.cli bench --context 1024 --rounds 20 --stage-rounds 2 --no-plots --synthetic qwen3-8b \
  --batch-methods "1=none,dflash,ddtree:64,ddtree:256 8=none,ddtree:64,ddtree:auto 32=none,ddtree:16,ddtree:auto" \
  --out $OUT/q8.json > $OUT/q8.log 2>&1; echo "rounds rc $?"
grep -aE "^ +[0-9]+ |floor" $OUT/q8.log | head -14
timeout 140 python3 scripts/gpu_check.py --sections E --attentions splitkv --out $OUT/gpu_check_e.json > $OUT/e.log 2>&1
echo "E rc $?"; tail -2 $OUT/e.log
