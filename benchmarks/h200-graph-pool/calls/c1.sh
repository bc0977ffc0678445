#!/bin/bash
# Call 1 (and call 7): the GPU checks with every capture on one stream, one pool (P: rounds hopping between graphs; E: graphed ==
# eager through the engine, every attention backend, overlap, slot reuse, prefill graphs; F: no host sync in replays).
export PYTHONUNBUFFERED=1 TQDM_DISABLE=1 TRITON_CACHE_DIR=$HOME/tf/triton
nvidia-smi -L; python3 -c "import torch, triton; print(torch.__version__, triton.__version__)"
timeout 520 python3 scripts/gpu_check.py --sections PEF --out $OUT/gpu_check_pef.json > $OUT/gpu_check_pef.log 2>&1
echo "rc $?"; grep -E '"|passed|FAILED' $OUT/gpu_check_pef.log | grep -v '^ *"seconds' | tail -60
