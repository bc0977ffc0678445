#!/bin/bash
# Call 4 (call 3 as planned got no machine last session): p_diag.py's repeat (as landed, walk / mask kernels
# off, lookup kernel off, three times each; lists the read-back's differing cells and the tree scores' largest
# difference), then gpu_check P (with its stage-graph check, not yet run on a GPU) and E (not rerun since
# lookup's chain change).
export PYTHONUNBUFFERED=1 TQDM_DISABLE=1 PYTHONPATH=$PWD
nvidia-smi -L; date; mkdir -p $HOME/p4
timeout -k 5 ${LIMIT:-300} python3 benchmarks/gpu-check-pool/calls/p_diag.py $HOME/p4/p_diag.json repeat > $HOME/p4/p_diag.log 2>&1
echo "diag rc $?"; grep -a -E "differing|ERROR" $HOME/p4/p_diag.log | cut -c1-1500; tar czf $OUT/p4.tgz -C $HOME p4; date
timeout -k 5 240 python3 scripts/gpu_check.py --sections PE --attentions splitkv,flex --out $HOME/p4/gpu_check_pe.json > $HOME/p4/gpu_check_pe.log 2>&1
echo "PE rc $?"; grep -a -E "FAILED|rror|all checks" $HOME/p4/gpu_check_pe.log | head; tar czf $OUT/p4.tgz -C $HOME p4; date
