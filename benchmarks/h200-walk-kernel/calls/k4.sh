#!/bin/bash
# gpu_check T's walk / verify-mask part alone (the kernels == walk / ancestor_mask on CUDA), then the Qwen3-8B
# synthetic rounds, this tree against HEAD's sources (.stage/old), one process each.
export PYTHONUNBUFFERED=1 TQDM_DISABLE=1
END=$((SECONDS + ${LIMIT:-400}))
nvidia-smi -L; date
mkdir -p $HOME/w
CMD="python3 -m treeflash.cli bench --synthetic qwen3-8b --context 1024 --rounds 30 --stage-rounds 2 --no-plots --batch-sizes 1 --methods none,ddtree:64"
CMD8="python3 -m treeflash.cli bench --synthetic smollm2-135m --context 1024 --rounds 40 --stage-rounds 3 --no-plots --batch-sizes 8 --methods none,ddtree:64"
for run in q8-new-2 q8-old-2 s8-new s8-old; do
  left=$((END - SECONDS - 5)); [ $left -lt 60 ] && { echo "skip $run"; continue; }
  case $run in *new*) pp=$PWD;; *old*) pp=$PWD/.stage/old;; esac; case $run in s8*) C="$CMD8";; *) C="$CMD";; esac
  echo "PYTHONPATH=$pp $C --out $run.json" | sed "s#$PWD#.#g" > $HOME/w/$run.cmd
  (cd $pp && PYTHONPATH=$pp timeout -k 5 $((left < 170 ? left : 170)) $C --out $HOME/w/$run.json > $HOME/w/$run.log 2>&1; echo "$run rc $?")
  grep -E "^ +[18] " $HOME/w/$run.log | tail -3; tar czf $OUT/w.tgz -C $HOME w
done
date
