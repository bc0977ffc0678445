#!/bin/bash
# Call 1: stage the GGUF's first part and the shipped drafter outside the repository copy; then gpu_check A/B/E
# (the GPU token equality of the first token drawn inside the prefill graph, 3449fe9 / 780fb5b).
mkdir -p ~/stage && cp .stage/a/part00 ~/stage/ && cp -r treeflash/default_drafter ~/d13 && ls ~/stage ~/d13 || exit 2
nvidia-smi -L; python3 -c "import torch, triton; print(torch.__version__, triton.__version__)"; date
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TQDM_DISABLE=1
echo "python3 scripts/gpu_check.py --sections ABE --out gpu_check.json" > $OUT/gpu_check.cmd
timeout -k 5 ${LIMIT:-300} python3 scripts/gpu_check.py --sections ABE --out $OUT/gpu_check.json 2>&1 | grep -v -i warn | tail -40
echo "rc ${PIPESTATUS[0]}"; date
