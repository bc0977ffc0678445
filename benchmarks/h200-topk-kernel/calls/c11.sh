#!/bin/bash
# Call 11: resume training to its end, with its final evaluation; the drafter to $OUT (<= 8 files a call);
# then, with the time left, gpu_check T on main's tree kernel (not run on the GPU since its last change).
test -f ~/smollm2.gguf -a -f ~/ckpt/latest || { echo "not warm"; exit 3; }
S=$SECONDS
bash .stage/chain11/train.sh ${LIMIT:-470}
mkdir -p $OUT/run && cp ~/run/drafter/*.safetensors ~/run/drafter/draft_vocab.json $OUT/run/
tar czf $OUT/run/meta.tgz -C ~ run/drafter/config.json run/drafter/model.safetensors.index.json train_out.log train_args.txt \
  $(cd ~ && ls run/history.json run/train.log run/*.png 2>/dev/null)
grep -E 'eval|done|data' ~/run/train.log | tail -8; ls -la $OUT/run
L=$((S + ${BUDGET:-585} - SECONDS)); echo "gpu_check T on main's tree kernel: $L s left"; if [ $L -gt 60 ]; then
TQDM_DISABLE=1 PYTHONPATH=$PWD:/tmp/site timeout $L python3 scripts/gpu_check.py --sections T --out $OUT/gpu_check_t_main.json \
  > ~/gpu_check_t_main.log 2>&1; echo "rc $?"; tail -3 ~/gpu_check_t_main.log; fi
