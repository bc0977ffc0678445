#!/bin/bash
# Call B: stage GGUF part 2 and the training prompts.
test -f ~/stage/p00 || { echo "p00 missing: not warm"; exit 3; }
cp .stage/g2/p01 .stage/train/prompts.jsonl.gz ~/stage/ || exit 2; ls -la ~/stage; date
