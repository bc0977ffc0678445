#!/bin/bash
# Call 3: split counts not a power of two (cold, 36 layers' caches); the draft log-softmax kernels against torch's;
# the kernel profile and whole Qwen3-8B-shape rounds of this code; gpu_check E (splitkv).
export PYTHONPATH=$PWD TQDM_DISABLE=1 PYTHONUNBUFFERED=1
timeout 150 python3 .stage/cold/sweep_splits.py $OUT/splits.json > $OUT/splits.txt 2>&1; echo "splits rc $?"
cat $OUT/splits.txt | cut -c1-120
timeout 60 python3 .stage/cold/lsm_ab.py $OUT/lsm.json > $OUT/lsm.txt 2>&1; echo "lsm rc $?"; cut -c1-200 $OUT/lsm.txt
timeout 120 python3 benchmarks/kernel_profile.py --shape qwen3-8b --methods none,dflash,ddtree:64 --context 1024 \
  --rounds 10 --rows 45 --modes graphs --out $OUT/prof.txt > /dev/null 2>&1; echo "prof rc $?"; grep "==" $OUT/prof.txt
timeout 200 python3 -m treeflash.cli bench --context 1024 --rounds 20 --stage-rounds 2 --no-plots --synthetic qwen3-8b \
  --batch-methods "1=none,dflash,ddtree:64,ddtree:256" --out $OUT/q8.json > $OUT/q8.txt 2>&1; echo "rounds rc $?"
grep -E "^ +[0-9]+ |floor" $OUT/q8.txt | head -12
timeout 150 python3 scripts/gpu_check.py --sections E --attentions splitkv --out $OUT/gpu_check_e.json > $OUT/e.log 2>&1
echo "E rc $?"; tail -3 $OUT/e.log
