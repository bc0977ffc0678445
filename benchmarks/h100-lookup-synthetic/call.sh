#!/bin/bash
# Call 1 (fresh machine): stage the GGUF's first part and the shipped drafter for call 2, then what needs
# neither: gpu_check CEF (the rewritten lookup on CUDA graphs) and the lookup's round cost at the synthetic
# SmolLM2-135M shape (random weights; batch 1 and 32).
END=$((SECONDS + ${LIMIT:-420}))
mkdir -p ~/stage && cp .stage/a/part00 ~/stage/ && cp -r .stage/d13 ~/drafter0 && ls ~/stage ~/drafter0 || exit 2
nvidia-smi -L; python3 -c "import torch, triton; print(torch.__version__, triton.__version__)"; date
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=$PWD:/tmp/site TREEFLASH_CACHE=$HOME/tfcache PYTHONUNBUFFERED=1
mkdir -p ~/b $OUT/s
echo "=== gpu_check $(date +%T)"
timeout -k 5 200 python3 scripts/gpu_check.py --sections CEF --attentions splitkv --out ~/b/gpu_check.json \
  > ~/b/gpu_check.log 2>&1; echo "rc $? $(date +%T)"; grep -E 'False|error|Error|sync inside' ~/b/gpu_check.log | head -20
tail -2 ~/b/gpu_check.log; cp ~/b/gpu_check.json ~/b/gpu_check.log $OUT/s/
CMD="python3 -m treeflash.cli bench --synthetic smollm2-135m --context 512 --rounds 40 --stage-rounds 10 --no-plots --batch-sizes 1,32 --methods none,none/ngram,ddtree:64,ddtree:64/ngram"
echo "$CMD --out lookup-synthetic.json" > $OUT/s/lookup-synthetic.cmd
echo "=== synthetic $(date +%T)"
timeout -k 5 $((END - SECONDS)) $CMD --out $OUT/s/lookup-synthetic.json 2>&1 | grep -v -i warn > $OUT/s/lookup-synthetic.log
echo "rc $? $(date +%T)"; tail -14 $OUT/s/lookup-synthetic.log
