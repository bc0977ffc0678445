#!/bin/bash
# Call 1 (fresh machine): correctness of the fused merge and the one-piece q/k norm on the GPU, then the kernel A/B
# and where the Qwen3-8B AR step's time goes with the fused merge.
export PYTHONPATH=$PWD TQDM_DISABLE=1 PYTHONUNBUFFERED=1
timeout 120 python3 -m pytest -q -p no:cacheprovider tests/test_kernels.py 2>&1 | tail -2
timeout 200 python3 benchmarks/splitkv_ab.py --shapes qwen3-8b,smollm2-135m --launches 0,4,5,19,20,21 \
  --out $OUT/skv_ab_fused.json 2>&1 | grep -v Warn | tail -20
timeout 240 python3 .stage/fm/fused.py scripts/gpu_check.py --sections E --attentions splitkv,hybrid --out $OUT/gpu_check_e_fused.json > ~/e.log 2>&1
echo "E rc $?"; tail -2 ~/e.log
timeout 150 python3 .stage/fm/fused.py benchmarks/kernel_profile.py --shape qwen3-8b --methods none,ddtree:64 \
  --context 1024 --rounds 10 --rows 30 --modes graphs --out $OUT/prof-qwen3-8b-fused.txt > ~/p.log 2>&1; echo "prof rc $?"
grep -A16 "==" $OUT/prof-qwen3-8b-fused.txt | cut -c1-110
