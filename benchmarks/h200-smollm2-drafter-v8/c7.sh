#!/bin/bash
# Call 7: stage blob part p06.
test -f ~/stage/p05 || { echo "p05 missing: not warm"; exit 3; }
cp .stage/g8/p06 ~/stage/ && ls -la ~/stage || exit 2
