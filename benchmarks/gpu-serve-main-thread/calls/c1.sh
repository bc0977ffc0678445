#!/bin/bash
# The server's engine on the main thread (HTTP on a second one), on CUDA: check.py (a tiny random float32
# target and drafter, DDTree-8, the server's warm-up captures CUDA graphs). FastAPI, uvicorn and pydantic
# travel as wheels (.whl, not committed).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1 TQDM_DISABLE=1 TREEFLASH_CACHE=$HOME/tfcache
nvidia-smi -L
python3 -c "import torch, fastapi, uvicorn, pydantic; print(torch.__version__, fastapi.__version__, uvicorn.__version__, pydantic.__version__)"
timeout -k 5 420 python3 benchmarks/gpu-serve-main-thread/check.py --out $OUT/check.json > $OUT/check.log 2>&1
echo "rc $?"; grep -v '"server_log_tail"\|"run_batch_stderr_tail"' $OUT/check.log | tail -22
