#!/bin/bash
# Next session, call 1 (fresh machine; on the gpu-next checkout; carry .whl, .stage/skv_main.py, .stage/next):
# the splitkv launch A/B (this branch's kernel and launches vs main's kernel vs FlexAttention), synthetic shapes.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl > /dev/null 2>&1
export PYTHONPATH=$PWD:/tmp/site TQDM_DISABLE=1
timeout 540 python3 benchmarks/splitkv_ab.py --baseline .stage/skv_main.py --out $OUT/skv_ab.json 2>&1 | grep -v Warn | tail -20
echo "rc ${PIPESTATUS[0]}"
