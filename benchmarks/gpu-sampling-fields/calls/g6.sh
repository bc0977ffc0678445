#!/bin/bash
# Call 6: gpu_check S failed in call 5 (a prefill graph's capture ran the first token's transition three times:
# fixed, GrammarSlots.first sets the state from the initial one); S again, then L with its timings, which now
# also time a structured round (a random 6-state automaton, a third of the vocabulary allowed), graphed and eager.
export PYTHONUNBUFFERED=1 TQDM_DISABLE=1 PYTHONPATH=$PWD
nvidia-smi -L; date; mkdir -p $OUT/g6
timeout -k 5 200 python3 scripts/gpu_check.py --sections S --out $OUT/g6/gpu_check_s.json > $OUT/g6/gpu_check_s.log 2>&1
echo "S rc $?"; grep -a -E "FAILED|Error|all checks|false|sync inside" $OUT/g6/gpu_check_s.log | head -20; date
timeout -k 5 ${LIMIT:-330} python3 scripts/gpu_check.py --sections L --logprobs-timings smollm2-135m,qwen3-8b \
  --out $OUT/g6/gpu_check_l_timings.json > $OUT/g6/gpu_check_l_timings.log 2>&1
echo "L rc $?"; grep -a -E "FAILED|Error|all checks|false|graphed ms" $OUT/g6/gpu_check_l_timings.log | head -20; date
