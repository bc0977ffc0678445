#!/bin/bash
# Call 3: resume training on the cached responses to the end. The eleventh drafter's MT-Bench T=0 bench beside it
# (a check that this session's numbers match the last one's) was commented out before the call, to leave the
# training the GPU (the step count was fixed from a slow measurement); it ran in call 4 instead (c4.sh).
test -f ~/smollm2.gguf || { echo "not warm"; exit 3; }
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1 TREEFLASH_CACHE=$HOME/tfcache TQDM_DISABLE=1
mkdir -p ~/b
B="python3 -m treeflash.cli bench --model $HOME/smollm2.gguf --max-tokens 128 --no-plots --num-prompts 0 --batch-size 32 --cuda-graph-sizes 32 --methods dflash,ddtree:64"
echo "$B --draft-model D11 --dataset mtbench --out v11-mtbench-t0.json" > ~/b/v11-mtbench-t0.cmd
#(timeout 200 $B --draft-model ~/drafter0 --dataset mtbench --out ~/b/v11-mtbench-t0.json > ~/b/v11-mtbench-t0.log 2>&1; echo "v11 bench rc $?") &
bash .stage/x12/calls/train.sh $((${LIMIT:-585} - SECONDS)) 0
wait
#grep -A6 -E '^mtbench x' ~/b/v11-mtbench-t0.log | head -8
grep -E 'ms/step|eval|resumed|wrote|drafter' ~/train_out.log | tail -10; ls ~/run; date
