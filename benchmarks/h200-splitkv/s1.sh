#!/bin/bash
# Call 1: wheels; stage GGUF part p0; kernel profile of the SmolLM2 shape with the default attention
# (splitkv), then the SmolLM2-shape synthetic rounds, flex vs splitkv.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
mkdir -p ~/stage && cp .stage/g7/p0 ~/stage/ || exit 2
export PYTHONPATH=$PWD:/tmp/site TQDM_DISABLE=1
timeout 120 python3 benchmarks/kernel_profile.py --shape smollm2-135m --methods none,ddtree:64 --modes graphs --rows 40 \
  --out $OUT/prof-smollm2-splitkv.txt 2>&1 | grep -v -E "USDT|Warning|warn" | grep -E "^==|^ " | head -24
timeout 240 python3 -m treeflash.cli bench --context 1024 --rounds 20 --stage-rounds 3 --no-plots \
  --variants compiled/16/splitkv,compiled/16/flex --synthetic smollm2-135m \
  --batch-methods '1=none,dflash,ddtree:16,ddtree:64,ddtree:256 8=none,ddtree:64' --out $OUT/smollm2.json > $OUT/smollm2.log 2>&1
echo "smollm2 rc $?"; cat $OUT/smollm2.txt
