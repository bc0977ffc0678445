#!/bin/bash
# Call 6: stage blob part p05.
test -f ~/stage/p04 || { echo "p04 missing: not warm"; exit 3; }
cp .stage/g8/p05 ~/stage/ && ls -la ~/stage || exit 2
