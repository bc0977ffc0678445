#!/bin/bash
# Call 5: stage blob part p04.
test -f ~/stage/p03 || { echo "p03 missing: not warm"; exit 3; }
cp .stage/g8/p04 ~/stage/ && ls -la ~/stage || exit 2
