#!/bin/bash
# Call 2 (ran in the next session with SECTIONS=CF LIMIT=150): stage the GGUF's first part and the shipped
# drafter (a copy in .stage/d13: the package's own folder stayed behind so that both calls fit 64 MiB) for
# call 3, then gpu_check C E F (no host sync in an eager round or a replay; graphed == eager) with the kernel
# in the rounds: call 1's T took 235 s on the H100 and its 260 s limit cut C.
mkdir -p ~/stage && cp .stage/a/part00 ~/stage/ && cp -r .stage/d13 ~/drafter0 && ls ~/stage ~/drafter0 || exit 2
nvidia-smi -L; python3 -c "import torch, triton; print(torch.__version__, triton.__version__)"; date
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=$PWD:/tmp/site TREEFLASH_CACHE=$HOME/tfcache PYTHONUNBUFFERED=1
mkdir -p $OUT/s
echo "=== gpu_check $(date +%T)"
timeout -k 5 ${LIMIT:-400} python3 scripts/gpu_check.py --sections ${SECTIONS:-CEF} --attentions splitkv --out $OUT/s/gpu_check.json \
  > $OUT/s/gpu_check.log 2>&1; echo "rc $? $(date +%T)"; grep -E 'False|rror|sync inside' $OUT/s/gpu_check.log | head -20
python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print({k: (sum(v is True for v in s.values()), len(s)) for k, s in d.items() if isinstance(s, dict)})" $OUT/s/gpu_check.json
tail -2 $OUT/s/gpu_check.log
