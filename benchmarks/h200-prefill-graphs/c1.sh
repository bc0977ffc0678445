#!/bin/bash
# Call 1: stage GGUF part 0, install wheels; tree-builder A/B; gpu_check E (graphed rounds + prefill == eager).
mkdir -p ~/stage && cp .stage/g4/q00 ~/stage/ || exit 2
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1 TQDM_DISABLE=1
mkdir -p $OUT/c1
timeout 100 python3 benchmarks/h200-prefill-graphs/tree_builder/measure.py --out $OUT/c1/tree_builder.json 2>&1 | grep -v -i warn | tail -10
timeout 240 python3 scripts/gpu_check.py --sections E --out $OUT/c1/gpu_check.json > $OUT/c1/gpu_check.log 2>&1; echo "gpu_check rc $?"
grep -v -i warn $OUT/c1/gpu_check.log | tail -30; date
