#!/bin/bash
# Call 3: rounds at the Qwen3-8B shape, flex vs splitkv (and hybrid), the goals' numbers.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl > /dev/null 2>&1
export PYTHONPATH=$PWD:/tmp/site TQDM_DISABLE=1
timeout 560 python3 -m treeflash.cli bench --context 1024 --rounds 20 --stage-rounds 3 --no-plots --synthetic qwen3-8b \
  --variants compiled/16/flex,compiled/16/splitkv --batch-methods '1=none,ddtree:64,ddtree:256 8=none,ddtree:64' \
  --out $OUT/q8-splitkv.json 2>&1 | grep -v Warn | tail -25
