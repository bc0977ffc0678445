#!/bin/bash
# Call 1: log-probs on CUDA. gpu_check L (tokens unchanged by asking, graphed == eager, transformers parity, no host
# sync in replays, graphed round times with and without them at the SmolLM2-135M and Qwen3-8B shapes), then F (no
# host sync in replays, every method) and E on the backends CUDA defaults to, splitkv and hybrid (graphed == eager:
# the read-back layout changed).
export PYTHONUNBUFFERED=1 TQDM_DISABLE=1 PYTHONPATH=$PWD
nvidia-smi -L; date; mkdir -p $HOME/l1
timeout -k 5 ${LIMIT_L:-300} python3 scripts/gpu_check.py --sections L --logprobs-timings smollm2-135m,qwen3-8b \
  --out $HOME/l1/gpu_check_l.json > $HOME/l1/gpu_check_l.log 2>&1
echo "L rc $?"; grep -a -E "FAILED|rror|all checks" $HOME/l1/gpu_check_l.log | head
timeout -k 5 ${LIMIT_EF:-200} python3 scripts/gpu_check.py --sections EF --attentions splitkv,hybrid \
  --out $HOME/l1/gpu_check_ef.json > $HOME/l1/gpu_check_ef.log 2>&1
echo "EF rc $?"; grep -a -E "FAILED|rror|all checks" $HOME/l1/gpu_check_ef.log | head
tar czf $OUT/l1.tgz -C $HOME l1; date
