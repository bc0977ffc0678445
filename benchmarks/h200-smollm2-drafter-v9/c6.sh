#!/bin/bash
# Call 6: stage blob part p05.
test -f ~/stage/p04 || { echo "p04 missing: not warm"; exit 3; }
cp .stage/g9/p05 ~/stage/ && ls ~/stage | tr '\n' ' ' || exit 2
