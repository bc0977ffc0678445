#!/bin/bash
# (As run. Its "old" process imported this code, not .stage/old: `python -m` puts the working directory first on
# the path; ../README.md says so, and g3.sh / g4.sh run the old code from inside its folder.)
# The gemv plan's second form (treeflash/moe_kernel.py: the down projection a program per pair and output
# block, then a combining kernel) on CUDA: check.py (a tiny float32 Qwen3-MoE under CUDA graphs, against
# transformers and plain decoding: few tokens now take the Triton kernels), layer_plans.py (one Qwen3-30B-A3B-shape
# layer, every plan and a few gemv launches, replayed as graphs), then the Qwen3-30B-A3B shape's rounds (random
# bf16 weights, context 1,024, batch 1 and 8), this code against the code before it (`git archive` of 7679b65's
# treeflash/ into the ignored .stage/old, carried), new then old.
export PYTHONUNBUFFERED=1 TQDM_DISABLE=1
END=$((SECONDS + ${LIMIT:-580}))
nvidia-smi -L; python3 -c "import torch, triton, transformers; print(torch.__version__, triton.__version__, transformers.__version__)"; date
mkdir -p $HOME/g2
PYTHONPATH=$PWD timeout -k 5 120 python3 benchmarks/gpu-moe/check.py --out $HOME/g2/check.json > $HOME/g2/check.log 2>&1; echo "check rc $?"
grep -v '^\s*"\(command\|date\)' $HOME/g2/check.log | tail -12; tar czf $OUT/g2.tgz -C $HOME g2
PYTHONPATH=$PWD timeout -k 5 150 python3 benchmarks/gpu-moe/layer_plans.py --tokens 1,2,4,8,16,17,33,65 \
  --gemv-launches "4,512,16,256,4;8,1024,16,256,4;16,512,16,256,4;8,512,8,256,4;8,512,32,256,4;8,512,16,512,4;8,512,16,256,8;8,256,16,256,4" \
  --out $HOME/g2/layer_plans.json > $HOME/g2/layer_plans.log 2>&1
echo "layer_plans rc $?"; tail -12 $HOME/g2/layer_plans.log | cut -c1-420; tar czf $OUT/g2.tgz -C $HOME g2
CMD="python3 -m treeflash.cli bench --synthetic qwen3-30b-a3b --context 1024 --rounds 20 --stage-rounds 2 --no-plots --batch-sizes 1,8 --methods none,ddtree:16,ddtree:64"
for who in new old; do
  left=$((END - SECONDS - 10)); [ $left -lt 40 ] && break
  src=$PWD; [ $who = old ] && src=$PWD/.stage/old
  echo "PYTHONPATH=$([ $who = old ] && echo .stage/old || echo .) $CMD --out $who.json" > $HOME/g2/$who.cmd
  PYTHONPATH=$src timeout -k 5 $left $CMD --out $HOME/g2/$who.json > $HOME/g2/$who.log 2>&1; echo "$who rc $?"
  grep -A10 "^qwen3-30b-a3b" $HOME/g2/$who.log | head -9; tar czf $OUT/g2.tgz -C $HOME g2
done
date
