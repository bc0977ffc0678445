#!/bin/bash
# Call 5: call 4 saw the tree scores differ by 1-2 float32 ulps (graphed vs eager) in 18 of 30 rounds of the
# process's first run only, none in the eight after it. Is it "first in the process", whatever the setting?
# Three fresh processes, each one setting first and then as landed: walk / mask kernels off; the decoder's
# compiled pieces off (compile_kernels=False); the tree builder and path kernels off.
export PYTHONUNBUFFERED=1 TQDM_DISABLE=1 PYTHONPATH=$PWD
nvidia-smi -L; date; mkdir -p $HOME/p5
i=0
for first in "walk and mask kernels off" "compiled pieces off" "tree builder and path kernels off"; do
  i=$((i+1))
  timeout -k 5 120 python3 benchmarks/gpu-check-pool/calls/p_diag.py $HOME/p5/p_diag_$i.json first "$first" > $HOME/p5/p_diag_$i.log 2>&1
  echo "process $i rc $?"; grep -a -E "differing|ERROR" $HOME/p5/p_diag_$i.log | cut -c1-600; tar czf $OUT/p5.tgz -C $HOME p5; date
done
