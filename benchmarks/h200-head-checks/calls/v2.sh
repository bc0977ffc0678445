#!/bin/bash
# Call 2 (the machine of call 1): wheels; join, check and unpack the GGUF; convert it; gpu_check section D (the real
# model: greedy float32 == transformers on the GPU, bf16 runs); then `treeflash serve` with the shipped drafter in
# float32 (DDTree, auto budget, warm-up), 32 clients, every answer compared offline with plain float32 decoding.
test -f ~/stage/part00 || { echo "part00 missing: not warm"; exit 3; }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
cat ~/stage/part00 .stage/b/part01 .stage/b/part02 > ~/smollm2.gguf.xz && rm ~/stage/part00
sha256sum ~/smollm2.gguf.xz | grep -q ^a0481d6664368815cb5d836fe5c865e5b9555f0cd1f2757f363643978f85bfde || { echo "bad xz sha256"; exit 4; }
xz -d -T8 ~/smollm2.gguf.xz || exit 5
sha256sum ~/smollm2.gguf | grep -q ^b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53 || { echo "bad gguf sha256"; exit 4; }
rm -rf ~/run; cp -r .stage/run ~/run
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1 TREEFLASH_CACHE=$HOME/tfcache TQDM_DISABLE=1
python3 -m treeflash.cli convert ~/smollm2.gguf 2>&1 | tail -1
timeout 150 python3 scripts/gpu_check.py --sections "" --smollm2 ~/smollm2.gguf --out $OUT/gpu_check_d.json > $OUT/gpu_check_d.log 2>&1
echo "gpu_check D rc $?"; grep -E 'passed|FAILED|Error' $OUT/gpu_check_d.log | tail -5; date
CHECK="--check-dtype float32 --model $HOME/smollm2.gguf --check-max-num-seqs 32" PHASE_LIMIT=150 timeout 360 \
  bash .stage/calls/serve_run.sh ddtree-fp32 "32:15" --draft-model $HOME/d13 --dtype float32
tar czf $OUT/ddtree-fp32.tgz -C $OUT ddtree-fp32 && rm -r $OUT/ddtree-fp32; ls $OUT; date
