#!/bin/bash
# Call 2, with lookup's chain 0 past the sequence's end (call 1 found trees differing only there): p_diag.py
# again, gpu_check P, and gpu_check T's lookup-kernel part (the kernel == the torch ops on CUDA).
export PYTHONUNBUFFERED=1 TQDM_DISABLE=1 PYTHONPATH=$PWD
nvidia-smi -L; date; mkdir -p $HOME/p2
timeout -k 5 150 python3 benchmarks/gpu-check-pool/calls/p_diag.py $HOME/p2/p_diag.json > $HOME/p2/p_diag.log 2>&1
echo "diag rc $?"; grep -a -E "differing|ERROR" $HOME/p2/p_diag.log; tar czf $OUT/p2.tgz -C $HOME p2
timeout -k 5 150 python3 scripts/gpu_check.py --sections P --out $HOME/p2/gpu_check_p.json > $HOME/p2/gpu_check_p.log 2>&1
echo "P rc $?"; grep -a -E "FAILED|rror" $HOME/p2/gpu_check_p.log | head; tar czf $OUT/p2.tgz -C $HOME p2
timeout 90 python3 -c "
import json, sys; sys.path.insert(0, 'scripts'); import gpu_check as g
r = g.check_lookup_kernel(); json.dump(r, open(sys.argv[1], 'w'), indent=1)
print(sum(v is True for v in r.values()), 'of', len(r), 'passed'); [print('FAILED', k) for k, v in r.items() if v is not True]
" $HOME/p2/gpu_check_lookup.json; echo "lookup check rc $?"
tar czf $OUT/p2.tgz -C $HOME p2; date
