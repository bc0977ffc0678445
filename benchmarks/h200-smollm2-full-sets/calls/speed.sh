#!/bin/bash
# speed.sh SET TEMPERATURE SECONDS: batch-1 tokens/s of every method on every prompt of SET, 128 new tokens,
# the shipped (thirteenth) drafter; JSON, table and plots into $OUT/SET-tT/, packed as one file.
name=speed-$1-t$2; dir=$OUT/$name; mkdir -p $dir
CMD="python3 -m treeflash.cli bench --model $HOME/smollm2.gguf --draft-model $HOME/d13 --dataset $1 --temperature $2 --num-prompts 0 --max-tokens 128 --methods none,dflash,ddtree:16,ddtree:32,ddtree:48,ddtree:64,ddtree:auto"
echo "$CMD --out $name.json" > $dir/cmd.txt
echo "=== $name $(date +%T)"
timeout -k 5 $3 $CMD --out $dir/$name.json 2>&1 | grep -v -i warn > $dir/$name.log; echo "rc $? $(date +%T)"
tail -14 $dir/$name.log
tar czf $OUT/$name.tgz -C $OUT $name && rm -r $dir
