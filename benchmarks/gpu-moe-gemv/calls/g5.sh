#!/bin/bash
# The landed rule (gemv up to N k <= E / 4 everywhere): check.py (float32 now takes gemv for one or two tokens, the
# dense plan past them) and the Qwen3-30B-A3B shape's AR steps at batch 1 and 4.
export PYTHONUNBUFFERED=1 TQDM_DISABLE=1 PYTHONPATH=$PWD
nvidia-smi -L; date; mkdir -p $HOME/g5
timeout -k 5 100 python3 benchmarks/gpu-moe/check.py --out $HOME/g5/check.json > $HOME/g5/check.log 2>&1; echo "check rc $?"
grep -A8 '"equal_to_plain_alone"' $HOME/g5/check.log; grep '"ok"\|logits_max' $HOME/g5/check.log; tar czf $OUT/g5.tgz -C $HOME g5
CMD="python3 -m treeflash.cli bench --synthetic qwen3-30b-a3b --context 1024 --rounds 20 --stage-rounds 2 --no-plots --batch-sizes 1,4 --methods none"
echo "$CMD --out new.json" > $HOME/g5/new.cmd
timeout -k 5 120 $CMD --out $HOME/g5/new.json > $HOME/g5/new.log 2>&1; echo "new rc $?"
grep -A4 "^qwen3-30b-a3b" $HOME/g5/new.log; tar czf $OUT/g5.tgz -C $HOME g5; date
