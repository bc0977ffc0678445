#!/bin/bash
# Capture cost A/B in one call (fresh machine): the code before (HEAD's treeflash, .stage/old) and after
# (this tree: Triton's cache pinned, no full gc per capture), each run twice in a row (fresh, then restarted:
# every cache filled), greedy warm-up at batch 1, SmolLM2 shape with random bf16 weights + the shipped drafter.
export PYTHONUNBUFFERED=1 TQDM_DISABLE=1
nvidia-smi -L; python3 -c "import torch, triton; print(torch.__version__, triton.__version__)"
ARGS="--model $PWD/.stage/rand --random-weights --draft-model $PWD/treeflash/default_drafter --max-num-seqs 1 --sampling greedy --no-profile"
one() {  # one NAME DIR LIMIT
  echo "== $1 $(date +%T)"
  (cd $2 && PYTHONPATH=$2 TREEFLASH_CACHE=$HOME/tf-$1 timeout $3 python3 benchmarks/capture_cost.py $ARGS --out $OUT/$4.json 2> $OUT/$4.log | grep -E '"(warm_up_s|graphs|build_s)"')
  grep -E "captured a CUDA graph for batch" $OUT/$4.log | cut -c1-100
}
one old $PWD/.stage/old 200 old1
one old $PWD/.stage/old 170 old2
one new $PWD 170 new1
one new $PWD 140 new2
du -sh ~/.triton/cache /tmp/torchinductor_$(whoami) ~/tf-old ~/tf-new 2>/dev/null
