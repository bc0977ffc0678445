#!/bin/bash
# Call 2 (warm or not; on gpu-next): correctness first — the CUDA test of the compiled pieces (qk_norm_rotary
# included) and gpu_check E over flex, sdpa and splitkv (graphs == eager, greedy == plain; float32: kv_store
# and the splitkv loop split both run) — then where the Qwen3-8B round's time goes with splitkv.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl > /dev/null 2>&1
export PYTHONPATH=$PWD:/tmp/site TQDM_DISABLE=1
timeout 120 python3 -m pytest -q -p no:cacheprovider tests/test_kernels.py 2>&1 | tail -2
timeout 300 python3 scripts/gpu_check.py --sections E --out $OUT/gpu_check_e.json > ~/e.log 2>&1
echo "E rc $?"; tail -1 ~/e.log
timeout 150 python3 benchmarks/kernel_profile.py --shape qwen3-8b --methods none,ddtree:64 --context 1024 --rounds 10 \
  --rows 30 --modes graphs --attention splitkv --out $OUT/prof-qwen3-8b-splitkv.txt > ~/p.log 2>&1; echo "prof rc $?"
grep -A6 "==" $OUT/prof-qwen3-8b-splitkv.txt | cut -c1-110
