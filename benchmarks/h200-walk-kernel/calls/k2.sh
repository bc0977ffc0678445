#!/bin/bash
# SmolLM2-135M synthetic rounds (3-layer drafter, random weights, context 1,024, batch 1): this tree (the walk and
# the verify mask as one Triton kernel each) against HEAD's sources (.stage/old), two processes each,
# interleaved; then gpu_check T (the kernels == the torch ops) and E (graphed == eager, splitkv), and the
# kernels per stage of the new rounds.
export PYTHONUNBUFFERED=1 TQDM_DISABLE=1
END=$((SECONDS + ${LIMIT:-560}))
nvidia-smi -L; python3 -c "import torch, triton; print(torch.__version__, triton.__version__)"; date
mkdir -p $HOME/w
CMD="python3 -m treeflash.cli bench --synthetic smollm2-135m --context 1024 --rounds 40 --stage-rounds 3 --no-plots --batch-sizes 1 --methods none,dflash,ddtree:64"
for run in new-1 old-1 new-2 old-2; do
  left=$((END - SECONDS - 60)); [ $left -lt 60 ] && { echo "skip $run"; continue; }
  case $run in new*) pp=$PWD;; old*) pp=$PWD/.stage/old;; esac
  echo "PYTHONPATH=$pp $CMD --out $run.json" | sed "s#$PWD#.#g" > $HOME/w/$run.cmd
  # (from the sources' own folder: `python3 -m` puts the working directory first on sys.path)
  (cd $pp && PYTHONPATH=$pp timeout -k 5 $((left < 150 ? left : 150)) $CMD --out $HOME/w/$run.json > $HOME/w/$run.log 2>&1; echo "$run rc $?")
  python3 -c "import json,sys; print(sys.argv[1], json.load(open(sys.argv[1]))['environment']['source_digest'])" $HOME/w/$run.json 2>/dev/null | head -c 300; echo
  grep -E "^ +1 " $HOME/w/$run.log | tail -3; tar czf $OUT/w.tgz -C $HOME w
done
export PYTHONPATH=$PWD
echo "=== gpu_check T $(date +%T)"
timeout 100 python3 scripts/gpu_check.py --sections T --out $HOME/w/gpu_check_t.json > $HOME/w/gpu_check_t.log 2>&1; echo "T rc $?"
python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print({k: (sum(v is True for v in s.values()), len(s)) for k, s in d.items() if isinstance(s, dict)})" $HOME/w/gpu_check_t.json
tar czf $OUT/w.tgz -C $HOME w
left=$((END - SECONDS - 50)); echo "=== gpu_check E left $left $(date +%T)"
[ $left -gt 60 ] && { timeout -k 5 $left python3 scripts/gpu_check.py --sections E --attentions splitkv --out $HOME/w/gpu_check_e.json \
  > $HOME/w/gpu_check_e.log 2>&1; echo "E rc $?"; python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print({k: (sum(v is True for v in s.values()), len(s)) for k, s in d.items() if isinstance(s, dict)})" $HOME/w/gpu_check_e.json; }
tar czf $OUT/w.tgz -C $HOME w
left=$((END - SECONDS - 5)); [ $left -gt 35 ] && timeout $left python3 benchmarks/stage_kernels.py --shape smollm2-135m --methods none,ddtree:64 --rows 60 --out $HOME/w/stages-new.txt > $HOME/w/stages.log 2>&1
tar czf $OUT/w.tgz -C $HOME w; date
