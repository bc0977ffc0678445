#!/bin/bash
# Call 12: on the gpu-next checkout, its top-k kernel first (the tree build against main's, carried as
# .stage/tk_main.py; gpu_check T and E), then the benches (acceptance on every prompt; batch-1 speed of
# the new and the shipped drafter, and the shipped one with main's tree kernel, in the same call) in
# order of importance with the time left; one tgz back.
S=$SECONDS
test -d ~/run/drafter || { echo "not warm"; exit 3; }
export PYTHONPATH=$PWD:/tmp/site TQDM_DISABLE=1
if [ -f benchmarks/tree_kernel_ab.py -a -f .stage/tk_main.py ]; then
  timeout 150 python3 benchmarks/tree_kernel_ab.py --baseline .stage/tk_main.py --out $OUT/tk_ab.json 2>&1 | tail -7
  echo "tk_ab rc ${PIPESTATUS[0]}"
  timeout 150 python3 scripts/gpu_check.py --sections T,E --attentions splitkv --out $OUT/gpu_check_te.json > ~/gpu_check_te.log 2>&1
  E=$?; echo "T,E rc $E"; tail -1 ~/gpu_check_te.log
  python3 -c "import json, sys; rows = json.load(open('$OUT/tk_ab.json'))['rows']; sys.exit(not all(r['this_equal'] is not False for r in rows))" 2>/dev/null
  if [ $? -ne 0 -o $E -ne 0 ]; then  # a kernel failed its checks: bench with main's instead
    echo "FALLBACK to main's tree kernel"; cp .stage/tk_main.py treeflash/tree_kernel.py; touch ~/fallback; fi
fi
END=$((S + ${BUDGET:-570})) bash .stage/chain11/bench.sh
