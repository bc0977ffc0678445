#!/bin/bash
# Call 3 (call 1's checks ran past their 100 s and 50 s limits: section E captures a graph per backend, method
# and sampling mode, and each compiles its Triton kernels first): the checks alone, with room to finish. Each
# section's result is written to $OUT as it ends, so a limit still returns the sections done.
export PYTHONPATH=$PWD TQDM_DISABLE=1 PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
timeout 300 python3 scripts/gpu_check.py --sections ABEF --target gpt_oss --attentions splitkv \
  --out $OUT/gpu_check_gpt_oss.json > $OUT/gpt_oss.log 2>&1; echo "ABEF gpt_oss rc $?"; tail -1 $OUT/gpt_oss.log
timeout 200 python3 scripts/gpu_check.py --sections EF --target mistral --attentions splitkv \
  --out $OUT/gpu_check_mistral.json > $OUT/mistral.log 2>&1; echo "EF mistral rc $?"; tail -1 $OUT/mistral.log
