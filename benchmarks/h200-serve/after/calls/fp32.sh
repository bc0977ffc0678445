#!/bin/bash
# The session's seventh device call (the machine of call 6, still warm): DDTree served in float32, 32 clients,
# every answer compared with plain float32 decoding offline.
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1 TREEFLASH_CACHE=$HOME/tfcache TQDM_DISABLE=1; test -f ~/smollm2.gguf || exit 3; rm -rf ~/run; cp -r .stage/run ~/run; CHECK="--check-dtype float32 --model $HOME/smollm2.gguf --check-max-num-seqs 32" PHASE_LIMIT=200 timeout 370 bash .stage/calls/serve_run.sh ddtree-fp32 "32:15" --draft-model $HOME/d13 --dtype float32; ls $OUT
