#!/bin/bash
# Call 3: the splitkv merge done by each row block's last program (no merge kernel). The GPU checks on this tree,
# then rounds A/B in one call: this tree against HEAD's treeflash (.stage/head, 00d0fb3), synthetic shapes.
export PYTHONUNBUFFERED=1 TQDM_DISABLE=1 TRITON_CACHE_DIR=$HOME/tf/triton
nvidia-smi -L; date
PYTHONPATH=$PWD timeout 300 python3 scripts/gpu_check.py --sections PEF --out $OUT/gpu_check_pef.json > $OUT/gpu_check_pef.log 2>&1
echo "gpu_check rc $?"; grep -E 'passed|FAILED|Error|error' $OUT/gpu_check_pef.log | tail -20; date
PYTHONPATH=$PWD timeout 120 python3 .stage/calls/mlcheck.py 2>&1 | grep -v -i warn | tee $OUT/mlcheck.txt | tail -30; date
one() {  # one NAME DIR SHAPE ROUNDS LIMIT
  mkdir -p $OUT/ab/$3
  CMD="python3 -m treeflash.cli bench --synthetic $3 --context 1024 --rounds $4 --stage-rounds 0 --no-plots --batch-sizes 1 --methods none,dflash,ddtree:64"
  echo "$CMD --out $1.json" > $OUT/ab/$3/cmd.txt
  (cd $2 && PYTHONPATH=$2 timeout $5 $CMD --out $OUT/ab/$3/$1.json 2>&1 | grep -v -i warn > $OUT/ab/$3/$1.log)
  echo "== $3 $1 rc $? $(date +%T)"; grep -E "^ +1 " $OUT/ab/$3/$1.log
}
one new1 $PWD smollm2-135m 200 110
one head1 $PWD/.stage/head smollm2-135m 200 80
one head2 $PWD/.stage/head smollm2-135m 200 80
one new2 $PWD smollm2-135m 200 80
one new1 $PWD qwen3-8b 40 110
one head1 $PWD/.stage/head qwen3-8b 40 90
(cd $OUT && tar czf ab.tgz ab && rm -r ab)
