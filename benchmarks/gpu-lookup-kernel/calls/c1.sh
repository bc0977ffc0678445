#!/bin/bash
# Call 1 (fresh machine; ran on an H100): stage the GGUF's first part and the shipped drafter for call 2, then what needs
# neither: the lookup kernel against the torch ops (benchmarks/lookup_profile.py), gpu_check T C E F (the
# kernel field for field, no host sync, graphed == eager) and the round cost with lookup at the synthetic
# SmolLM2-135M shape (random weights; batch 1 and 32), as the H100 run of faa4f37 measured it.
END=$((SECONDS + ${LIMIT:-560}))
mkdir -p ~/stage && cp .stage/a/part00 ~/stage/ && cp -r treeflash/default_drafter ~/drafter0 && ls ~/stage ~/drafter0 || exit 2
nvidia-smi -L; python3 -c "import torch, triton; print(torch.__version__, triton.__version__)"; date
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=$PWD:/tmp/site TREEFLASH_CACHE=$HOME/tfcache PYTHONUNBUFFERED=1
mkdir -p $OUT/s
echo "=== lookup_profile $(date +%T)"
timeout -k 5 150 python3 benchmarks/lookup_profile.py --out $OUT/s/lookup_profile.json > $OUT/s/lookup_profile.log 2>&1
echo "rc $? $(date +%T)"; cat $OUT/s/lookup_profile.log | grep -v -i warn | head -60
echo "=== gpu_check $(date +%T)"
timeout -k 5 260 python3 scripts/gpu_check.py --sections TCFE --attentions splitkv --out $OUT/s/gpu_check.json \
  > $OUT/s/gpu_check.log 2>&1; echo "rc $? $(date +%T)"; grep -E 'False|rror|sync inside' $OUT/s/gpu_check.log | head -20
python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print({k: (sum(v is True for v in s.values()), len(s)) for k, s in d.items() if isinstance(s, dict)})" $OUT/s/gpu_check.json
tail -2 $OUT/s/gpu_check.log
CMD="python3 -m treeflash.cli bench --synthetic smollm2-135m --context 512 --rounds 40 --stage-rounds 10 --no-plots --batch-sizes 1,32 --methods none,none/ngram,ddtree:64,ddtree:64/ngram"
echo "$CMD --out lookup-synthetic.json" > $OUT/s/lookup-synthetic.cmd
echo "=== synthetic $(date +%T)"
timeout -k 5 $((END - SECONDS)) $CMD --out $OUT/s/lookup-synthetic.json 2>&1 | grep -v -i warn > $OUT/s/lookup-synthetic.log
echo "rc $? $(date +%T)"; tail -14 $OUT/s/lookup-synthetic.log
