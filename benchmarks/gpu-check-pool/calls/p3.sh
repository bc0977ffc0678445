#!/bin/bash
# Call 3: call 2 found one round's read-back different with every tree, walk and state equal; p_diag.py with
# the tree scores compared and the read-back's differing cells listed, as landed, with the walk / mask kernels
# off and with the lookup kernel off, three times each (call 2 ran each once).
export PYTHONUNBUFFERED=1 TQDM_DISABLE=1 PYTHONPATH=$PWD
nvidia-smi -L; date; mkdir -p $HOME/p3
timeout -k 5 ${LIMIT:-300} python3 benchmarks/gpu-check-pool/calls/p_diag.py $HOME/p3/p_diag.json repeat > $HOME/p3/p_diag.log 2>&1
echo "diag rc $?"; grep -a -E "differing|ERROR" $HOME/p3/p_diag.log | cut -c1-1500; tar czf $OUT/p3.tgz -C $HOME p3; date
