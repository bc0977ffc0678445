#!/bin/bash
# Call 5: resume training (no new data) to its end; results in $OUT; then bench with the time left.
S=$SECONDS
test -f ~/smollm2.gguf -a -f ~/ckpt/latest || { echo "not warm"; exit 3; }
bash .stage/chain4/train.sh $((330 - SECONDS + S)) 0
mkdir -p $OUT/run && cp ~/run/drafter/*.safetensors ~/run/drafter/draft_vocab.json $OUT/run/
tar czf $OUT/run/meta.tgz -C ~ run/drafter/config.json run/drafter/model.safetensors.index.json run/history.json run/train.log train_out.log train_args.txt $(cd ~ && ls run/*.png 2>/dev/null)
grep -E 'eval|done|data' ~/run/train.log | tail -10; ls -la $OUT/run
END=$((S + 580)) bash .stage/chain3/bench.sh
