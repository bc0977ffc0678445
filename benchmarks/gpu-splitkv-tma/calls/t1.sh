#!/bin/bash
# Call 1: the TMA sweep (sweep_tma.py, cold, Qwen3-8B heads), then Qwen3-8B synthetic rounds (random weights,
# context 1,024, batch 1) with the rule's launches and with the sweep's choice (BEST.json), one process each.
export PYTHONUNBUFFERED=1 TQDM_DISABLE=1 PYTHONPATH=$PWD
END=$((SECONDS + ${LIMIT:-560}))
nvidia-smi -L; python3 -c "import torch, triton; print(torch.__version__, triton.__version__)"; date
mkdir -p $HOME/t
timeout -k 5 260 python3 benchmarks/gpu-splitkv-tma/calls/sweep_tma.py $HOME/t/sweep.json $HOME/t/best.json 230 \
  > $HOME/t/sweep.txt 2>&1; echo "sweep rc $?"; tail -5 $HOME/t/sweep.txt
[ -s $HOME/t/best.json ] || echo '{}' > $HOME/t/best.json
echo '{}' > $HOME/t/rule.json
tar czf $OUT/t.tgz -C $HOME t
CMD="bench --synthetic qwen3-8b --context 1024 --rounds 30 --stage-rounds 2 --no-plots --batch-sizes 1 --methods none,ddtree:64,ddtree:256"
for run in q8-rule-1 q8-tma-1; do
  left=$((END - SECONDS - 5)); [ $left -lt 60 ] && { echo "skip $run"; continue; }
  case $run in *rule*) b=rule;; *tma*) b=best;; esac
  echo "python3 benchmarks/gpu-splitkv-tma/calls/bench_patched.py $b.json $CMD --out $run.json" > $HOME/t/$run.cmd
  timeout -k 5 $((left < 150 ? left : 150)) python3 benchmarks/gpu-splitkv-tma/calls/bench_patched.py $HOME/t/$b.json \
    $CMD --out $HOME/t/$run.json > $HOME/t/$run.txt 2>&1; echo "$run rc $?"
  grep -E "patched|^ +1 " $HOME/t/$run.txt | tail -5; tar czf $OUT/t.tgz -C $HOME t
done
date
