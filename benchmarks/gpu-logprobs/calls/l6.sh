#!/bin/bash
# Call 6: after the logit rules became one method (Speculator.adjusted_logits): gpu_check L and F, no timings.
export PYTHONUNBUFFERED=1 TQDM_DISABLE=1 PYTHONPATH=$PWD
nvidia-smi -L; date; mkdir -p $HOME/l6
timeout -k 5 ${LIMIT:-300} python3 scripts/gpu_check.py --sections LF \
  --out $HOME/l6/gpu_check_lf.json > $HOME/l6/gpu_check_lf.log 2>&1
echo "LF rc $?"; grep -a -E "FAILED|rror|all checks" $HOME/l6/gpu_check_lf.log | head
tar czf $OUT/l6.tgz -C $HOME l6; date
