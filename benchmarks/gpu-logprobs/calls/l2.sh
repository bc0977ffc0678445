#!/bin/bash
# Call 2: with penalties landed beside log-probs (and log-probs packed from the logits less their log-sum-exp):
# gpu_check L (log-probs and penalties, with graphed round times at the SmolLM2-135M and Qwen3-8B shapes), E on
# the backends CUDA defaults to (SamplingTensors gained rows), P (the runner's saved state gained the counts).
export PYTHONUNBUFFERED=1 TQDM_DISABLE=1 PYTHONPATH=$PWD
nvidia-smi -L; date; mkdir -p $HOME/l2
timeout -k 5 ${LIMIT_L:-240} python3 scripts/gpu_check.py --sections L --logprobs-timings smollm2-135m,qwen3-8b \
  --out $HOME/l2/gpu_check_l.json > $HOME/l2/gpu_check_l.log 2>&1
echo "L rc $?"; grep -a -E "FAILED|rror|all checks" $HOME/l2/gpu_check_l.log | head
timeout -k 5 ${LIMIT_EP:-300} python3 scripts/gpu_check.py --sections EP --attentions splitkv,hybrid \
  --out $HOME/l2/gpu_check_ep.json > $HOME/l2/gpu_check_ep.log 2>&1
echo "EP rc $?"; grep -a -E "FAILED|rror|all checks" $HOME/l2/gpu_check_ep.log | head
tar czf $OUT/l2.tgz -C $HOME l2; date
