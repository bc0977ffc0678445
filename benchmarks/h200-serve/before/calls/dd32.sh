#!/bin/bash
# The session's fourth device call (the machine of call 3, still warm): the DDTree server again, 32 clients for
# 5 s, with --debug, to see the traceback of call 3's failures (server.log).
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1 TREEFLASH_CACHE=$HOME/tfcache TQDM_DISABLE=1; ls ~/smollm2.gguf || exit 3; PHASE_LIMIT=100 bash .stage/calls/serve_run.sh dd32 "32:5" --draft-model $HOME/d13 --debug --log-level info; grep -v "captured a CUDA" $OUT/dd32/server.log | grep -v -i warn | head -150 | cut -c1-300
