#!/bin/bash
# gpu_check T's walk / verify-mask part alone (the kernels == walk / ancestor_mask on CUDA), then the Qwen3-8B
# synthetic rounds, this tree against HEAD's sources (.stage/old), one process each.
export PYTHONUNBUFFERED=1 TQDM_DISABLE=1
END=$((SECONDS + ${LIMIT:-400}))
nvidia-smi -L; date
mkdir -p $HOME/w
(export PYTHONPATH=$PWD; timeout 90 python3 -c "
import json, sys; sys.path.insert(0, 'scripts'); import gpu_check as g
r = g.check_walk_kernel(); json.dump(r, open(sys.argv[1], 'w'), indent=1)
print(sum(v is True for v in r.values()), 'of', len(r), 'passed'); [print('FAILED', k) for k, v in r.items() if v is not True]
" $HOME/w/gpu_check_walk.json; echo "walk check rc $?")
tar czf $OUT/w.tgz -C $HOME w
CMD="python3 -m treeflash.cli bench --synthetic qwen3-8b --context 1024 --rounds 30 --stage-rounds 2 --no-plots --batch-sizes 1 --methods none,ddtree:64"
for run in q8-new q8-old; do
  left=$((END - SECONDS - 5)); [ $left -lt 60 ] && { echo "skip $run"; continue; }
  case $run in *new) pp=$PWD;; *old) pp=$PWD/.stage/old;; esac
  echo "PYTHONPATH=$pp $CMD --out $run.json" | sed "s#$PWD#.#g" > $HOME/w/$run.cmd
  (cd $pp && PYTHONPATH=$pp timeout -k 5 $((left < 170 ? left : 170)) $CMD --out $HOME/w/$run.json > $HOME/w/$run.log 2>&1; echo "$run rc $?")
  grep -E "^ +1 " $HOME/w/$run.log | tail -3; tar czf $OUT/w.tgz -C $HOME w
done
date
