#!/bin/bash
# Call 8: call 7 named layer 0's attention block (inputs equal, outputs not; o_proj's input differs) with
# every attention backend: the first GEMM, q/k/v's, gives other bits in the process's first admission. cuBLAS
# says its results repeat bit for bit only with a fixed workspace where several streams are used
# (CUBLAS_WORKSPACE_CONFIG). p_layers.py and p_diag.py (as landed first), each in a fresh process with
# CUBLAS_WORKSPACE_CONFIG=:4096:8; then p_layers.py with compile_kernels off (the separate projections).
export PYTHONUNBUFFERED=1 TQDM_DISABLE=1 PYTHONPATH=$PWD
nvidia-smi -L; date; mkdir -p $HOME/p8
CUBLAS_WORKSPACE_CONFIG=:4096:8 timeout -k 5 100 python3 benchmarks/gpu-check-pool/calls/p_layers.py $HOME/p8/p_layers_ws.json > $HOME/p8/p_layers_ws.log 2>&1
echo "layers, workspace fixed rc $?"; grep -a -E "^calls|^\{|Error" $HOME/p8/p_layers_ws.log | head -4 | cut -c1-500; date
CUBLAS_WORKSPACE_CONFIG=:4096:8 timeout -k 5 100 python3 benchmarks/gpu-check-pool/calls/p_diag.py $HOME/p8/p_diag_ws.json first "as landed" > $HOME/p8/p_diag_ws.log 2>&1
echo "diag, workspace fixed rc $?"; grep -a -E "differing|ERROR" $HOME/p8/p_diag_ws.log | cut -c1-500; tar czf $OUT/p8.tgz -C $HOME p8; date
TREEFLASH_P_LAYERS_EAGER=1 timeout -k 5 100 python3 benchmarks/gpu-check-pool/calls/p_layers.py $HOME/p8/p_layers_eager.json > $HOME/p8/p_layers_eager.log 2>&1
echo "layers, compile_kernels off rc $?"; grep -a -E "^calls|^\{|Error" $HOME/p8/p_layers_eager.log | head -4 | cut -c1-500; tar czf $OUT/p8.tgz -C $HOME p8; date
