#!/bin/bash
# Call 10: with every row argument of the compiled pieces marked dynamic (treeflash/models/kernels.py), so
# the process's first call compiles the same graph as every later one: p_layers.py (first vs second
# admission, module by module) and p_diag.py as landed first in a fresh process; then gpu_check P alone
# (its own process, so its rounds are the process's first).
export PYTHONUNBUFFERED=1 TQDM_DISABLE=1 PYTHONPATH=$PWD
nvidia-smi -L; date; mkdir -p $HOME/p10
timeout -k 5 100 python3 benchmarks/gpu-check-pool/calls/p_layers.py $HOME/p10/p_layers.json > $HOME/p10/p_layers.log 2>&1
echo "layers rc $?"; grep -a -E "^calls|^\{|Error" $HOME/p10/p_layers.log | head -3 | cut -c1-400; date
timeout -k 5 120 python3 benchmarks/gpu-check-pool/calls/p_diag.py $HOME/p10/p_diag.json first "as landed" > $HOME/p10/p_diag.log 2>&1
echo "diag rc $?"; grep -a -E "differing|ERROR" $HOME/p10/p_diag.log | cut -c1-500; tar czf $OUT/p10.tgz -C $HOME p10; date
timeout -k 5 120 python3 scripts/gpu_check.py --sections P --out $HOME/p10/gpu_check_p.json > $HOME/p10/gpu_check_p.log 2>&1
echo "P rc $?"; grep -a -E "FAILED|rror|all checks" $HOME/p10/gpu_check_p.log | head -3; tar czf $OUT/p10.tgz -C $HOME p10; date
