#!/bin/bash
# Call 9: resume training to its end; gpu_check E (splitkv, hybrid); the drafter to $OUT (<= 8 files come
# back a call); then the Qwen3-8B flex vs hybrid attention A/B with the time left.
test -f ~/smollm2.gguf -a -f ~/ckpt/latest || { echo "not warm"; exit 3; }
S=$SECONDS
bash .stage/chain8/train.sh ${LIMIT:-330}
# build_chain (42b4c50) and the rest under CUDA graphs: graphed == eager, greedy == plain (float32).
TQDM_DISABLE=1 PYTHONPATH=$PWD:/tmp/site timeout 120 python3 scripts/gpu_check.py --sections E --attentions splitkv,hybrid \
  --out $OUT/gpu_check_e.json > ~/gpu_check_e.log 2>&1; echo "E rc $?"; tail -1 ~/gpu_check_e.log
mkdir -p $OUT/run && cp ~/run/drafter/*.safetensors ~/run/drafter/draft_vocab.json $OUT/run/
tar czf $OUT/run/meta.tgz -C ~ run/drafter/config.json run/drafter/model.safetensors.index.json run/history.json run/train.log train_out.log train_args.txt $(cd ~ && ls run/*.png 2>/dev/null)
grep -E 'eval|done|data' ~/run/train.log | tail -8; ls -la $OUT/run
L=$((S + ${BUDGET:-585} - SECONDS)); echo "A/B: $L s left"; if [ $L -gt 90 ]; then
TQDM_DISABLE=1 PYTHONPATH=$PWD:/tmp/site timeout $L python3 -m treeflash.cli bench --context 1024 --rounds 20 --stage-rounds 3 \
  --no-plots --variants compiled/16/flex,compiled/16/hybrid --synthetic qwen3-8b \
  --batch-methods '1=none,ddtree:64,ddtree:256 8=none,ddtree:64' --out ~/qwen3-hybrid.json > ~/qwen3-hybrid.log 2>&1
echo "A/B rc $?"; tail -12 ~/qwen3-hybrid.txt; tar czf $OUT/qwen3-hybrid.tgz -C ~ qwen3-hybrid.json qwen3-hybrid.txt qwen3-hybrid.log; fi
