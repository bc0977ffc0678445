#!/bin/bash
# Call 4: launch_for + the hybrid's folded-rows rule: Qwen3-8B-shape rounds, flex vs splitkv vs hybrid.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl > /dev/null 2>&1
export PYTHONPATH=$PWD:/tmp/site TQDM_DISABLE=1
timeout 100 python3 -m pytest -q -p no:cacheprovider tests/test_kernels.py tests/test_splitkv_attention.py 2>&1 | grep -E "^(FAILED|E )|passed|failed" | cut -c1-300 | head -12
timeout 420 python3 -m treeflash.cli bench --context 1024 --rounds 20 --stage-rounds 3 --no-plots --synthetic qwen3-8b \
  --variants compiled/16/flex,compiled/16/hybrid \
  --batch-methods '1=none,ddtree:64,ddtree:256 8=none,ddtree:64 32=none,ddtree:16' \
  --out $OUT/q8-hybrid2.json 2>&1 | grep -v Warn | tail -22
