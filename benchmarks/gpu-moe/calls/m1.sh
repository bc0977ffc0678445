#!/bin/bash
# Mixtures of experts on CUDA: check.py (a tiny float32 Qwen3-MoE against transformers and plain decoding under
# CUDA graphs), layer_plans.py (one Qwen3-30B-A3B-shape layer, each expert plan replayed as a graph), then the
# Qwen3-30B-A3B shape's rounds (random bf16 weights, context 1,024, batch 1 and 8): our AR step against the floor
# of the bytes a token reads, and the chain / DDTree rounds.
export PYTHONUNBUFFERED=1 TQDM_DISABLE=1 PYTHONPATH=$PWD
END=$((SECONDS + ${LIMIT:-570}))
nvidia-smi -L; python3 -c "import torch, triton, transformers; print(torch.__version__, triton.__version__, transformers.__version__)"; date
mkdir -p $HOME/m
timeout -k 5 120 python3 benchmarks/gpu-moe/check.py --out $HOME/m/check.json > $HOME/m/check.log 2>&1; echo "check rc $?"
grep -v '^\s*"\(command\|date\)' $HOME/m/check.log | tail -12; tar czf $OUT/m.tgz -C $HOME m
timeout -k 5 120 python3 benchmarks/gpu-moe/layer_plans.py --out $HOME/m/layer_plans.json > $HOME/m/layer_plans.log 2>&1
echo "layer_plans rc $?"; tail -16 $HOME/m/layer_plans.log; tar czf $OUT/m.tgz -C $HOME m
CMD="python3 -m treeflash.cli bench --synthetic qwen3-30b-a3b --context 1024 --rounds 30 --stage-rounds 3 --no-plots --batch-sizes 1,8 --methods none,dflash,ddtree:16,ddtree:64"
echo "$CMD --out qwen3-30b-a3b.json" > $HOME/m/synthetic.cmd
left=$((END - SECONDS - 15))
timeout -k 5 $left $CMD --out $HOME/m/qwen3-30b-a3b.json > $HOME/m/synthetic.log 2>&1; echo "synthetic rc $?"
tail -22 $HOME/m/synthetic.log; tar czf $OUT/m.tgz -C $HOME m; date
