#!/bin/bash
# Call C: the synthetic shapes' rounds timed back to back (Qwen3-8B and SmolLM2-135M, random weights), with the
# engine's overlap and without (/sync), in one process per shape.
nvidia-smi -L; python3 -c "import torch, triton; print(torch.__version__, triton.__version__)"; date
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TQDM_DISABLE=1
for shape in qwen3-8b smollm2-135m; do
mkdir -p $OUT/$shape
CMD="python3 -m treeflash.cli bench --synthetic $shape --context 1024 --rounds 40 --stage-rounds 0 --no-plots --batch-sizes 1 --methods none,none/sync,ddtree:64,ddtree:64/sync"
echo "$CMD --out $shape.json" > $OUT/$shape/cmd.txt
timeout -k 5 ${LIMIT:-100} $CMD --out $OUT/$shape/$shape.json 2>&1 | grep -v -i warn | tee $OUT/$shape/$shape.log | tail -9
done
date
