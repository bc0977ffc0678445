#!/bin/bash
# Call D: stage the GGUF's first part and the shipped drafter outside the repository copy; then the admission
# A/B (benchmarks/admission/admission_profile.py) at the SmolLM2 shape, DDTree-64 and plain decoding.
mkdir -p ~/stage && cp .stage/a/part00 ~/stage/ && cp -r treeflash/default_drafter ~/d13 && ls ~/stage ~/d13 || exit 2
nvidia-smi -L; python3 -c "import torch, triton; print(torch.__version__, triton.__version__)"; date
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
A=.stage/run/admission_profile.py
for spec in ddtree:64 none; do
  n=adm-s150-${spec/:/}; echo "python benchmarks/admission/admission_profile.py --shape smollm2-135m --spec $spec --prompt-len 150 --requests 30 --out $n.json" > $OUT/$n.cmd
  timeout -k 5 100 python3 $A --shape smollm2-135m --spec $spec --prompt-len 150 --requests 30 --out $OUT/$n.json 2>&1 | grep -v -i warn | grep -E 'variant|admit_ms|request_ms|Error|error' 
done
date
