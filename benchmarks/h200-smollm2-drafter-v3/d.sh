#!/bin/bash
# Call D: resume training (no new data), then bench parts with whatever time is left; results in $OUT.
S=$SECONDS
test -f ~/smollm2.gguf -a -f ~/ckpt/latest || { echo "not warm"; exit 3; }
bash .stage/chain2/train.sh $((560 - SECONDS + S)) 0
mkdir -p $OUT/run && cp ~/run/drafter/*.safetensors $OUT/run/
tar czf $OUT/run/meta.tgz -C ~ run/drafter/config.json run/drafter/model.safetensors.index.json run/history.json run/train.log train_out.log train_args.txt $(cd ~ && ls run/*.png 2>/dev/null)
tar czf - -C ~ data | split -b 15m - $OUT/run/data.tgz.
grep -E 'eval|done' ~/run/train.log | tail -8; ls -la $OUT/run
END=$((S + 585)) bash .stage/chain2/bench.sh
