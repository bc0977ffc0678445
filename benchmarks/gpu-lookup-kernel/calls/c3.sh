#!/bin/bash
# Not needed in the end: calls 2 and 4 ran C, E and F (see ../README.md).
# Call 3 (fresh machine; too little device time was left for the two calls the real-model speed run needs):
# gpu_check C E F with the kernel in the rounds (no host sync in an eager round or a replay; graphed ==
# eager, greedy == plain decoding, with prompt lookup on `none` and DDTree-64).
nvidia-smi -L; python3 -c "import torch, triton; print(torch.__version__, triton.__version__)"; date
export PYTHONPATH=$PWD TREEFLASH_CACHE=$HOME/tfcache PYTHONUNBUFFERED=1
mkdir -p $OUT/s
echo "=== gpu_check $(date +%T)"
timeout -k 5 ${LIMIT:-330} python3 scripts/gpu_check.py --sections CEF --attentions splitkv --out $OUT/s/gpu_check.json \
  > $OUT/s/gpu_check.log 2>&1; echo "rc $? $(date +%T)"; grep -E 'False|rror|sync inside' $OUT/s/gpu_check.log | head -20
python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print({k: (sum(v is True for v in s.values()), len(s)) for k, s in d.items() if isinstance(s, dict)})" $OUT/s/gpu_check.json
tail -2 $OUT/s/gpu_check.log
