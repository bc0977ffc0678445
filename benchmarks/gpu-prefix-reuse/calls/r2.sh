#!/bin/bash
# Call 2: time to first token with a 4,096-token system prompt reused (whole 512-token chunks taken from the
# slot) and prefilled again, two engines on the same random bf16 weights, at the Qwen3-8B and SmolLM2-135M
# shapes (benchmarks/gpu-prefix-reuse/ttft.py).
export PYTHONUNBUFFERED=1 TQDM_DISABLE=1 PYTHONPATH=$PWD
nvidia-smi -L; date; mkdir -p $OUT/r2
for shape in qwen3-8b smollm2-135m; do
  timeout -k 5 240 python3 benchmarks/gpu-prefix-reuse/ttft.py --shape $shape --system-tokens 4096 --pairs 4 \
    --out $OUT/r2/ttft_$shape.json > $OUT/r2/ttft_$shape.log 2>&1
  echo "$shape rc $?"; tail -14 $OUT/r2/ttft_$shape.log; date
done
