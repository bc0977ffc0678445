#!/bin/bash
# Capture cost: the same greedy warm-up (SmolLM2 shape, random bf16 weights, the shipped drafter, auto budget,
# buckets 1 and 2) in two processes in a row on a fresh machine: the second finds every cache the first filled.
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TREEFLASH_CACHE=$HOME/tfcache TQDM_DISABLE=1
nvidia-smi -L; python3 -c "import torch, triton; print(torch.__version__, triton.__version__)"
tc() { du -sh ~/.triton/cache /tmp/torchinductor_$(whoami) 2>/dev/null | tr '\n' ' '; echo; }
for i in 1 2; do
  echo "== run $i"; tc
  timeout 260 python3 benchmarks/capture_cost.py --model .stage/rand --random-weights --draft-model treeflash/default_drafter \
    --max-num-seqs 2 --sampling greedy --out $OUT/run$i.json 2> $OUT/run$i.log | grep -E '"(wall_s|warm_up_s|graphs)"'
  echo "rc=$?"; grep -E "captured" $OUT/run$i.log | awk '{print $1, $0}' | cut -c1-120 | tail -25
done
tc
