#!/bin/bash
# Call 5: min_tokens beside the penalties and logit_bias (gpu_check L's penalised requests carry all three, with a
# stop token), with the graphed round times, and F.
export PYTHONUNBUFFERED=1 TQDM_DISABLE=1 PYTHONPATH=$PWD
nvidia-smi -L; date; mkdir -p $HOME/l5
timeout -k 5 ${LIMIT:-300} python3 scripts/gpu_check.py --sections LF --logprobs-timings smollm2-135m,qwen3-8b \
  --out $HOME/l5/gpu_check_lf.json > $HOME/l5/gpu_check_lf.log 2>&1
echo "LF rc $?"; grep -a -E "FAILED|rror|all checks" $HOME/l5/gpu_check_lf.log | head
tar czf $OUT/l5.tgz -C $HOME l5; date
