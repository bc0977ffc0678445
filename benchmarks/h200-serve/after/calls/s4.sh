#!/bin/bash
# Call B (after the fix): wheels; join, check and unpack the GGUF; convert it; then `treeflash serve` with the
# shipped drafter (DDTree, auto budget, bf16) on a fresh machine: warm-up, then 1, 8 and 32 clients; then the
# same server started again (stored budget profile, compiled kernels cached): 32 clients.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
if ! test -f ~/smollm2.gguf; then
test -f ~/stage/part00 || { echo "part00 missing: not warm"; exit 3; }
cat ~/stage/part00 .stage/b/part01 .stage/b/part02 > ~/smollm2.gguf.xz && rm ~/stage/part00
sha256sum ~/smollm2.gguf.xz | grep -q ^a0481d6664368815cb5d836fe5c865e5b9555f0cd1f2757f363643978f85bfde || { echo "bad xz sha256"; exit 4; }
xz -d -T8 ~/smollm2.gguf.xz || exit 5
sha256sum ~/smollm2.gguf | grep -q ^b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53 || { echo "bad gguf sha256"; exit 4; }
fi
rm -rf ~/run; cp -r .stage/run ~/run
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1 TREEFLASH_CACHE=$HOME/tfcache TQDM_DISABLE=1
python3 -m treeflash.cli convert ~/smollm2.gguf 2>&1 | tail -1
bash .stage/calls/serve_run.sh ddtree-bf16 "1:15 8:20 32:25" --draft-model $HOME/d13
bash .stage/calls/serve_run.sh ddtree-bf16-restart "32:20" --draft-model $HOME/d13
ls -la ~/tfcache/budget_profiles/; cat ~/tfcache/budget_profiles/*.json | head -60
date
