#!/bin/bash
# Call 4: gpu_check's no-sync replay check made one function (replays_without_sync): F and L (no timings) again.
export PYTHONUNBUFFERED=1 TQDM_DISABLE=1 PYTHONPATH=$PWD
nvidia-smi -L; date; mkdir -p $HOME/l4
timeout -k 5 ${LIMIT:-240} python3 scripts/gpu_check.py --sections LF --out $HOME/l4/gpu_check_lf.json \
  > $HOME/l4/gpu_check_lf.log 2>&1
echo "LF rc $?"; grep -a -E "FAILED|rror|all checks" $HOME/l4/gpu_check_lf.log | head
tar czf $OUT/l4.tgz -C $HOME l4; date
