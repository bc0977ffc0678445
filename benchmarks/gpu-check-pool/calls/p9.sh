#!/bin/bash
# Call 9: p_ops.py (the query's norm and rotary, attend_new and SDPA wrapped and recorded; compile_kernels
# off, attention sdpa) in a fresh process.
export PYTHONUNBUFFERED=1 TQDM_DISABLE=1 PYTHONPATH=$PWD
nvidia-smi -L; date; mkdir -p $HOME/p9
timeout -k 5 100 python3 benchmarks/gpu-check-pool/calls/p_ops.py $HOME/p9/p_ops.json > $HOME/p9/p_ops.log 2>&1
echo "ops rc $?"; grep -a -E "^calls|^\{|Error" $HOME/p9/p_ops.log | head -6 | cut -c1-900; tar czf $OUT/p9.tgz -C $HOME p9; date
