#!/bin/bash
# Call 3: stage GGUF part p2.
test -f ~/stage/p1 || { echo "p1 missing: not warm"; exit 3; }
cp .stage/g7/p2 ~/stage/ && ls -la ~/stage || exit 2
