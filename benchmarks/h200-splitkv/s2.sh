#!/bin/bash
# Call 2: stage GGUF part p1.
test -f ~/stage/p0 || { echo "p0 missing: not warm"; exit 3; }
cp .stage/g7/p1 ~/stage/ && ls -la ~/stage || exit 2
