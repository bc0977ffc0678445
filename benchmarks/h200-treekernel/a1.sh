#!/bin/bash
# Call 1: wheels; stage blob part p00; the Triton tree builder on the GPU: gpu_check T (== build_tree),
# then the SmolLM2-shape synthetic rounds with and without it (splitkv attention, the default there).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
mkdir -p ~/stage && cp .stage/g6/p00 ~/stage/ || exit 2
export PYTHONPATH=$PWD:/tmp/site TQDM_DISABLE=1
timeout 90 python3 scripts/gpu_check.py --sections T --out $OUT/gpu_check_t.json > $OUT/gpu_check_t.log 2>&1
echo "T rc $?"; grep -E "True|False|error|passed|FAILED" $OUT/gpu_check_t.log | head -12
timeout 200 python3 -m treeflash.cli bench --context 1024 --rounds 20 --stage-rounds 3 --no-plots \
  --variants compiled/16/splitkv,compiled/16/splitkv/treekernel --synthetic smollm2-135m \
  --batch-methods '1=none,ddtree:16,ddtree:64,ddtree:256 8=ddtree:64' --out $OUT/smollm2-tk.json > $OUT/smollm2-tk.log 2>&1
echo "smollm2 rc $?"; cat $OUT/smollm2-tk.txt; date
