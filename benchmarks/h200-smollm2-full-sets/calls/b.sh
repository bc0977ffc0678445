#!/bin/bash
# Call B: wheels; join, check and unpack the GGUF; convert it; then batch-1 tokens/s on every HumanEval prompt.
test -f ~/stage/part00 || { echo "part00 missing: not warm"; exit 3; }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl || exit 1
cat ~/stage/part00 .stage/g/b/part01 .stage/g/b/part02 > ~/smollm2.gguf.xz && rm ~/stage/part00
sha256sum ~/smollm2.gguf.xz | grep -q ^e6443c87902fbba0eb8d09a38f349927a99ec0693c53fef9109ae7617e857f4c || { echo "bad xz sha256"; exit 4; }
xz -d -T8 ~/smollm2.gguf.xz || exit 5
sha256sum ~/smollm2.gguf | grep -q ^b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53 || { echo "bad gguf sha256"; exit 4; }
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1 TREEFLASH_CACHE=$HOME/tfcache TQDM_DISABLE=1
python3 -m treeflash.cli convert ~/smollm2.gguf 2>&1 | tail -1
bash .stage/g/calls/speed.sh humaneval 0 ${LIMIT:-560}
