#!/bin/bash
# The SmolLM2-135M synthetic shape's rounds with the drafter shape this package ships for SmolLM2 (3 layers reading
# 5 target layers: the shape's default now) against z-lab's 5 layers (the default before, `--drafter-layers 5`),
# random weights, context 1,024, batch 1, steps back to back; two processes each, interleaved (a process's AR
# step moves by a few percent, so each ratio is taken within its own process).
export PYTHONUNBUFFERED=1 TQDM_DISABLE=1 PYTHONPATH=$PWD
END=$((SECONDS + ${LIMIT:-480}))
nvidia-smi -L; python3 -c "import torch, triton; print(torch.__version__, triton.__version__)"; date
mkdir -p $HOME/s
CMD="python3 -m treeflash.cli bench --synthetic smollm2-135m --context 1024 --rounds 40 --stage-rounds 3 --no-plots --batch-sizes 1 --methods none,dflash,ddtree:64"
for run in l3-1 l5-1 l3-2 l5-2; do
  left=$((END - SECONDS - ${CHECK_S:-150})); [ $left -lt 60 ] && { echo "skip $run"; continue; }
  case $run in l3*) extra="";; l5*) extra="--drafter-layers 5";; esac
  echo "$CMD $extra --out $run.json" > $HOME/s/$run.cmd
  timeout -k 5 $((left < 200 ? left : 200)) $CMD $extra --out $HOME/s/$run.json > $HOME/s/$run.log 2>&1; echo "$run rc $?"
  tail -8 $HOME/s/$run.log | grep -v "^wrote"; tar czf $OUT/s.tgz -C $HOME s
done
# Exactness on CUDA at this code (the engine's caches resized in place, KVCache.resize_, since the last GPU check):
# graphed rounds == eager, greedy with a drafter == plain decoding, seeded sampling reproducible; splitkv attention.
echo "=== gpu_check $(date +%T)"
left=$((END - SECONDS - 10)); [ $left -lt 30 ] && { echo "no time for gpu_check"; exit 0; }
timeout -k 5 $left python3 scripts/gpu_check.py --sections EB --attentions splitkv --out $HOME/s/gpu_check.json \
  > $HOME/s/gpu_check.log 2>&1; echo "rc $? $(date +%T)"; grep -E 'False|rror|sync inside' $HOME/s/gpu_check.log | head -20
python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print({k: (sum(v is True for v in s.values()), len(s)) for k, s in d.items() if isinstance(s, dict)})" $HOME/s/gpu_check.json
tar czf $OUT/s.tgz -C $HOME s; date
