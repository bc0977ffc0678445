#!/bin/bash
# Call 6: call 5 found the first run of every process different (tree scores 1-2 ulps apart, graphed vs
# eager), whichever setting ran first, the decoder's compiled pieces off included. p_admit.py: are the
# process's first speculators already different right after admission (eager prefill only), or after one
# eager round? Twice, in two fresh processes.
export PYTHONUNBUFFERED=1 TQDM_DISABLE=1 PYTHONPATH=$PWD
nvidia-smi -L; date; mkdir -p $HOME/p6
for i in 1 2; do
  timeout -k 5 100 python3 benchmarks/gpu-check-pool/calls/p_admit.py $HOME/p6/p_admit_$i.json > $HOME/p6/p_admit_$i.log 2>&1
  echo "process $i rc $?"; grep -a -E "differing|Error" $HOME/p6/p_admit_$i.log | cut -c1-900; tar czf $OUT/p6.tgz -C $HOME p6; date
done
