#!/bin/bash
# Call 1: gpu_check P failed (benchmarks/gpu-splitkv-tma/runs/gpu_check_cfp.json) (graphed != eager somewhere in its 30 hopping rounds; it passed on
# 2026-12-04 before prompt lookup became the CUDA default and before the lookup, walk and mask kernels):
# p_diag.py names the round and field, under five settings.
export PYTHONUNBUFFERED=1 TQDM_DISABLE=1 PYTHONPATH=$PWD
nvidia-smi -L; date; mkdir -p $HOME/p
timeout -k 5 ${LIMIT:-500} python3 benchmarks/gpu-check-pool/calls/p_diag.py $HOME/p/p_diag.json > $HOME/p/p_diag.log 2>&1
echo "rc $?"; grep -a -E "differing|ERROR" $HOME/p/p_diag.log
tar czf $OUT/p.tgz -C $HOME p; date
