#!/bin/bash
# m1.sh (mixtures of experts on CUDA) in its first 400 s, then, in the same machine start, the pending check of
# the server's engine on the main thread (benchmarks/gpu-serve-main-thread/calls/c1.sh: wheels in .whl).
START=$SECONDS
LIMIT=400 bash benchmarks/gpu-moe/calls/m1.sh
left=$((560 - (SECONDS - START)))
echo "=== serve main-thread check, ${left}s left $(date +%T)"
[ $left -lt 90 ] && { echo "no time for it"; exit 0; }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1 TQDM_DISABLE=1 TREEFLASH_CACHE=$HOME/tfcache
timeout -k 5 $((left - 10)) python3 benchmarks/gpu-serve-main-thread/check.py --out $OUT/check.json > $OUT/check.log 2>&1
echo "rc $?"; grep -v '"server_log_tail"\|"run_batch_stderr_tail"' $OUT/check.log | tail -22
