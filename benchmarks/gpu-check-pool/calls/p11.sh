#!/bin/bash
# Call 11: after the compiled pieces' fix (f0b51d5), gpu_check E (graphed == eager, every attention backend),
# B (speculative greedy == plain, seeded sampling) and C (no host sync in eager rounds).
export PYTHONUNBUFFERED=1 TQDM_DISABLE=1 PYTHONPATH=$PWD
nvidia-smi -L; date; mkdir -p $HOME/p11
timeout -k 5 ${LIMIT:-300} python3 scripts/gpu_check.py --sections EBC --out $HOME/p11/gpu_check_ebc.json > $HOME/p11/gpu_check_ebc.log 2>&1
echo "EBC rc $?"; grep -a -E "FAILED|rror|all checks|seconds" $HOME/p11/gpu_check_ebc.log | head; tar czf $OUT/p11.tgz -C $HOME p11; date
