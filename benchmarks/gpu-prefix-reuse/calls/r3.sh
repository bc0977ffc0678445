#!/bin/bash
# Call 3: free slots keep their prompt's rows while rounds run over them (1e36037), and prompts admitted
# together prefill a shared chunk once (0aa9798), on CUDA with graphs and overlap. gpu_check R (reuse on ==
# off, float32 and bfloat16; the two-at-a-time case now takes from a slot rounds ran over) and B (speculative
# greedy == plain, seeded sampling); then ttft.py --together 8: eight requests under one new 4,096-token
# system prompt submitted at once, reuse on and off.
export PYTHONUNBUFFERED=1 TQDM_DISABLE=1 PYTHONPATH=$PWD
nvidia-smi -L; date; mkdir -p $OUT/r3
timeout -k 5 150 python3 scripts/gpu_check.py --sections RB --out $OUT/r3/gpu_check.json > $OUT/r3/gpu_check.log 2>&1
echo "RB rc $?"; grep -a -E "FAILED|Error|all checks|false|differ|sync inside" $OUT/r3/gpu_check.log | head -20; date
for shape in smollm2-135m qwen3-8b; do
  timeout -k 5 $([ $shape = qwen3-8b ] && echo 180 || echo 80) python3 benchmarks/gpu-prefix-reuse/ttft.py --shape $shape --together 8 --system-tokens 4096 \
    --pairs 2 --out $OUT/r3/together_$shape.json > $OUT/r3/together_$shape.log 2>&1
  echo "$shape rc $?"; tail -12 $OUT/r3/together_$shape.log; date
done
