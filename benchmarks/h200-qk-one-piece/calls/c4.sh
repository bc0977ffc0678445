#!/bin/bash
export PYTHONPATH=$PWD TQDM_DISABLE=1 PYTHONUNBUFFERED=1
TORCH_LOGS=output_code timeout 200 python3 .stage/fm/qk_micro.py > ~/m.log 2>&1; echo "rc $?"
grep "^N " ~/m.log; cp ~/m.log $OUT/qk_micro.log
grep -n "def triton_\|XBLOCK\|grid\|num_warps" ~/m.log | grep -v "^.*#" | head -60
