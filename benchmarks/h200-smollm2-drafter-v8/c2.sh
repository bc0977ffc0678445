#!/bin/bash
# Call 2: stage blob part p01.
test -f ~/stage/p00 || { echo "p00 missing: not warm"; exit 3; }
cp .stage/g8/p01 ~/stage/ && ls -la ~/stage || exit 2
