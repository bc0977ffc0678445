#!/bin/bash
# Call 12: on the gpu-next checkout, its kernels first (the tree kernel against main's, carried as
# .stage/tk_main.py; the sampler's block sums; graphed == eager, greedy == plain with them), then the
# benches (acceptance on every prompt; batch-1 speed of the new and the shipped drafter in the same
# call, on both sets) in order of importance with the time left; one tgz back.
S=$SECONDS
test -d ~/run/drafter || { echo "not warm"; exit 3; }
export PYTHONPATH=$PWD:/tmp/site TQDM_DISABLE=1
if [ -f benchmarks/tree_kernel_ab.py -a -f .stage/tk_main.py ]; then
  timeout 100 python3 benchmarks/tree_kernel_ab.py --baseline .stage/tk_main.py --out $OUT/tk_ab.json 2>&1 | tail -7
  echo "tk_ab rc ${PIPESTATUS[0]}"
  timeout 40 python3 benchmarks/sampler_cost.py --rows 2080 --vocab 49152 --out $OUT/sampler_cost.json 2>&1 | tail -8
  timeout 90 python3 scripts/gpu_check.py --sections E --attentions splitkv --out $OUT/gpu_check_e.json > ~/gpu_check_e.log 2>&1
  E=$?; echo "E rc $E"; tail -1 ~/gpu_check_e.log
  python3 -c "import json, sys; rows = json.load(open('$OUT/tk_ab.json'))['rows']; sys.exit(not all(r['this_equal'] for r in rows))" 2>/dev/null
  if [ $? -ne 0 -o $E -ne 0 ]; then  # a kernel failed its checks: bench with main's instead
    echo "FALLBACK to main's tree kernel and sampler"; cp .stage/tk_main.py treeflash/tree_kernel.py
    cp .stage/sampling_main.py treeflash/sampling.py; fi
fi
END=$((S + ${BUDGET:-570})) bash .stage/chain10/bench.sh
