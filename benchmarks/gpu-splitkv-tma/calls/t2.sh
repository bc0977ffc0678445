#!/bin/bash
# Call 2, on call 1's warm machine ($HOME/t holds its files): the rounds again in the other order, then
# gpu_check C, F and P (no host sync in eager and replayed rounds, graphs sharing one pool) with the walk
# kernels, and with the sweep's launches in place when it chose any (gpu_check_cfp_tma).
export PYTHONUNBUFFERED=1 TQDM_DISABLE=1 PYTHONPATH=$PWD
END=$((SECONDS + ${LIMIT:-560}))
nvidia-smi -L; date; ls $HOME/t || { echo "cold machine: call 1's files are gone"; mkdir -p $HOME/t; echo '{}' > $HOME/t/best.json; echo '{}' > $HOME/t/rule.json; }
CMD="bench --synthetic qwen3-8b --context 1024 --rounds 30 --stage-rounds 2 --no-plots --batch-sizes 1 --methods none,ddtree:64,ddtree:256"
runs="q8-tma-2 q8-rule-2"; [ "$(cat $HOME/t/best.json)" = "{}" ] && runs=""
for run in $runs; do
  left=$((END - SECONDS - 5)); [ $left -lt 60 ] && { echo "skip $run"; continue; }
  case $run in *rule*) b=rule;; *tma*) b=best;; esac
  echo "python3 benchmarks/gpu-splitkv-tma/calls/bench_patched.py $b.json $CMD --out $run.json" > $HOME/t/$run.cmd
  timeout -k 5 $((left < 150 ? left : 150)) python3 benchmarks/gpu-splitkv-tma/calls/bench_patched.py $HOME/t/$b.json \
    $CMD --out $HOME/t/$run.json > $HOME/t/$run.txt 2>&1; echo "$run rc $?"
  grep -E "patched|^ +1 " $HOME/t/$run.txt | tail -5; tar czf $OUT/t.tgz -C $HOME t
done
left=$((END - SECONDS - 10)); echo "=== gpu_check CFP left $left $(date +%T)"
[ $left -gt 60 ] && { timeout -k 5 $left python3 scripts/gpu_check.py --sections CFP --attentions splitkv --out $HOME/t/gpu_check_cfp.json \
  > $HOME/t/gpu_check_cfp.log 2>&1; echo "CFP rc $?"; grep -E 'False|rror|sync inside' $HOME/t/gpu_check_cfp.log | head -20
  python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print({k: (sum(v is True for v in s.values()), len(s)) for k, s in d.items() if isinstance(s, dict)})" $HOME/t/gpu_check_cfp.json; }
tar czf $OUT/t.tgz -C $HOME t; date
