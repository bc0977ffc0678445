#!/bin/bash
# Call 1: stage blob part 0, install wheels; gpu_check E (graphed rounds + prefill == eager, after the
# prefill graphs started keeping hidden states); synthetic Qwen3-8B ddtree:auto at batch 1/8/32 (no-draft candidate).
mkdir -p ~/stage && cp .stage/g5/p00 ~/stage/ || exit 2
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1 TQDM_DISABLE=1
mkdir -p $OUT/c1
timeout 200 python3 scripts/gpu_check.py --sections E --out $OUT/c1/gpu_check.json > $OUT/c1/gpu_check.log 2>&1; echo "gpu_check rc $?"
grep -v -i warn $OUT/c1/gpu_check.log | tail -4; date
timeout 230 python3 -m treeflash.cli bench --synthetic qwen3-8b --context 1024 --rounds 20 --stage-rounds 2 --no-plots \
  --batch-methods '1=none,ddtree:auto 8=none,ddtree:auto 32=none,ddtree:auto' --out $OUT/c1/qwen3-8b-auto.json > $OUT/c1/qwen3-8b-auto.log 2>&1; echo "q8 rc $?"
python3 -m treeflash.cli bench --replot $OUT/c1/qwen3-8b-auto.json --no-plots 2>/dev/null | tail -9; grep -i "chose\|auto" $OUT/c1/qwen3-8b-auto.log | tail -8; date
