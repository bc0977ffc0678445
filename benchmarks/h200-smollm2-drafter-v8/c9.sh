#!/bin/bash
# Call 9: resume training to its end (with its final evaluation: chain8's 330 s cut the seventh run
# ~500 steps early); the drafter to $OUT (<= 8 files come back a call); then the new drafter's batch-1
# MT-Bench speed against the shipped one's, side by side, with the time left.
test -f ~/smollm2.gguf -a -f ~/ckpt/latest || { echo "not warm"; exit 3; }
S=$SECONDS
bash .stage/chain9/train.sh ${LIMIT:-480}
mkdir -p $OUT/run && cp ~/run/drafter/*.safetensors ~/run/drafter/draft_vocab.json $OUT/run/
tar czf $OUT/run/meta.tgz -C ~ run/drafter/config.json run/drafter/model.safetensors.index.json train_out.log train_args.txt \
  $(cd ~ && ls run/history.json run/train.log run/*.png 2>/dev/null)
grep -E 'eval|done|data' ~/run/train.log | tail -8; ls -la $OUT/run
