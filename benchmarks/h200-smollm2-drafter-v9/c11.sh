#!/bin/bash
# Call 11: resume training to its end, with its final evaluation; the drafter to $OUT (<= 8 files a call);
# then, with the time left, the Qwen3-8B shape at budgets 63 / 255 against 64 / 256: a budget of 2^k - 1
# verifies 2^k tokens (root included), which GEMM tiles may like better than 2^k + 1.
test -f ~/smollm2.gguf -a -f ~/ckpt/latest || { echo "not warm"; exit 3; }
S=$SECONDS
bash .stage/chain10/train.sh ${LIMIT:-470}
mkdir -p $OUT/run && cp ~/run/drafter/*.safetensors ~/run/drafter/draft_vocab.json $OUT/run/
tar czf $OUT/run/meta.tgz -C ~ run/drafter/config.json run/drafter/model.safetensors.index.json train_out.log train_args.txt \
  $(cd ~ && ls run/history.json run/train.log run/*.png 2>/dev/null)
grep -E 'eval|done|data' ~/run/train.log | tail -8; ls -la $OUT/run
L=$((S + ${BUDGET:-585} - SECONDS)); echo "qwen3-8b budgets: $L s left"; if [ $L -gt 100 ]; then
TQDM_DISABLE=1 PYTHONPATH=$PWD:/tmp/site timeout $L python3 -m treeflash.cli bench --synthetic qwen3-8b --context 1024 \
  --rounds 20 --stage-rounds 3 --no-plots --batch-methods '1=none,ddtree:63,ddtree:64,ddtree:255,ddtree:256' \
  --out ~/q8-budgets.json > ~/q8-budgets.log 2>&1
echo "rc $?"; tail -9 ~/q8-budgets.txt; tar czf $OUT/q8-budgets.tgz -C ~ q8-budgets.json q8-budgets.txt q8-budgets.log; fi
