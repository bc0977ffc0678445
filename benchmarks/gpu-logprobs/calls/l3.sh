#!/bin/bash
# Call 3: logit_bias beside the penalties: gpu_check L again (its penalised requests now carry a logit_bias too),
# with the graphed round times, and F (no host sync in replays, every method).
export PYTHONUNBUFFERED=1 TQDM_DISABLE=1 PYTHONPATH=$PWD
nvidia-smi -L; date; mkdir -p $HOME/l3
timeout -k 5 ${LIMIT_L:-240} python3 scripts/gpu_check.py --sections LF --logprobs-timings smollm2-135m,qwen3-8b \
  --out $HOME/l3/gpu_check_lf.json > $HOME/l3/gpu_check_lf.log 2>&1
echo "LF rc $?"; grep -a -E "FAILED|rror|all checks" $HOME/l3/gpu_check_lf.log | head
tar czf $OUT/l3.tgz -C $HOME l3; date
