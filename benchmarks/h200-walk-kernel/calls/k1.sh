#!/bin/bash
# Kernels per stage of SmolLM2-135M-shape rounds (3-layer drafter, random weights, context 1,024, batch 1), the
# graphed rounds' kernel list, then gpu_check E and B with splitkv (the caches' resize_ since the last GPU check).
export PYTHONUNBUFFERED=1 TQDM_DISABLE=1 PYTHONPATH=$PWD
END=$((SECONDS + ${LIMIT:-420}))
nvidia-smi -L; python3 -c "import torch, triton; print(torch.__version__, triton.__version__)"; date
mkdir -p $HOME/k
timeout 150 python3 benchmarks/stage_kernels.py --shape smollm2-135m --methods none,ddtree:64 --rows 60 \
  --out $HOME/k/stages-smollm2.txt > $HOME/k/stages.log 2>&1; echo "stages rc $?"
tar czf $OUT/k.tgz -C $HOME k
timeout 120 python3 benchmarks/kernel_profile.py --shape smollm2-135m --methods none,ddtree:64 --context 1024 \
  --modes graphs --rows 70 --out $HOME/k/prof-smollm2.txt > $HOME/k/prof.log 2>&1; echo "prof rc $?"
tar czf $OUT/k.tgz -C $HOME k
echo "=== gpu_check $(date +%T)"
left=$((END - SECONDS - 10)); [ $left -lt 30 ] && { echo "no time for gpu_check"; exit 0; }
timeout -k 5 $left python3 scripts/gpu_check.py --sections EB --attentions splitkv --out $HOME/k/gpu_check.json \
  > $HOME/k/gpu_check.log 2>&1; echo "rc $? $(date +%T)"; grep -E 'False|rror|sync inside' $HOME/k/gpu_check.log | head -20
python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print({k: (sum(v is True for v in s.values()), len(s)) for k, s in d.items() if isinstance(s, dict)})" $HOME/k/gpu_check.json
tar czf $OUT/k.tgz -C $HOME k; date
