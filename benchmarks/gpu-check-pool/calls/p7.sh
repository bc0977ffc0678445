#!/bin/bash
# Call 7: call 6 found the process's first speculator different right after admission (target layer 2's
# keys and values, the drafter's caches; 1-ulp cells), the second and third equal. p_layers.py names the
# first module whose inputs are equal and outputs are not, with the default attention (splitkv), sdpa and
# flex, each in a fresh process.
export PYTHONUNBUFFERED=1 TQDM_DISABLE=1 PYTHONPATH=$PWD
nvidia-smi -L; date; mkdir -p $HOME/p7
for a in default sdpa flex; do
  arg=$a; [ $a = default ] && arg=""
  timeout -k 5 100 python3 benchmarks/gpu-check-pool/calls/p_layers.py $HOME/p7/p_layers_$a.json $arg > $HOME/p7/p_layers_$a.log 2>&1
  echo "$a rc $?"; grep -a -E "^calls|^\{|Error" $HOME/p7/p_layers_$a.log | head -6 | cut -c1-700; tar czf $OUT/p7.tgz -C $HOME p7; date
done
