#!/bin/bash
# Call 2: wheels; join, check and unpack the GGUF; convert it; unpack the prompt files; write own prompts,
# generate responses for $DATA minutes, then train until the call's limit (checkpoints every 200 steps).
test -f ~/stage/part00 || { echo "part00 missing: not warm"; exit 3; }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
cat ~/stage/part00 .stage/b/part01 .stage/b/part02 > ~/smollm2.gguf.xz && rm ~/stage/part00
sha256sum ~/smollm2.gguf.xz | grep -q ^a0481d6664368815cb5d836fe5c865e5b9555f0cd1f2757f363643978f85bfde || { echo "bad xz sha256"; exit 4; }
xz -d -T8 ~/smollm2.gguf.xz || exit 5
sha256sum ~/smollm2.gguf | grep -q ^b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53 || { echo "bad gguf sha256"; exit 4; }
sha256sum -c <<'SUMS' || exit 4
27ae3b018bc36a815f228142e2998b4d93d54fa1c65de1c5239c1f3dc5136fc4  .stage/x17/p/code-prompts-all.jsonl.xz
28152696b07af7bb8e643972caf6f0522b79534fe364db99b95d252cd49aa41a  .stage/x17/p/sharegpt-all.jsonl.xz
SUMS
for f in code-prompts-all sharegpt-all; do xz -dc .stage/x17/p/$f.jsonl.xz | gzip -1 > ~/stage/$f.jsonl.gz; done
export PYTHONPATH=$PWD:/tmp/site TREEFLASH_CACHE=$HOME/tfcache
python3 -m treeflash.cli convert ~/smollm2.gguf 2>&1 | tail -1
bash .stage/x17/calls/train_b.sh $((${LIMIT:-575} - SECONDS)) ${DATA:-4.0}
grep -E 'data|ms/step|eval|resumed|vocab|initialised|own prompts: only' ~/train_out.log | tail -14; ls ~/ckpt | tail -3; date
test -f ~/run/history.json || exit 6
mkdir -p $OUT/run && cp ~/run/drafter/*.safetensors ~/run/drafter/draft_vocab.json $OUT/run/
tar czf $OUT/run/meta.tgz -C ~ run/drafter/config.json run/drafter/model.safetensors.index.json train_out.log train_args.txt \
  $(cd ~ && ls run/history.json run/train.log run/*.png 2>/dev/null); ls -la $OUT/run
