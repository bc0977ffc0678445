#!/bin/bash
# Call 2: stage blob part p01.
test -f ~/stage/p00 || { echo "p00 missing: not warm"; exit 3; }
cp .stage/g9/p01 ~/stage/ && ls ~/stage | tr '\n' ' ' || exit 2
