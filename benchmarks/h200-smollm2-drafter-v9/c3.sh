#!/bin/bash
# Call 3: stage blob part p02.
test -f ~/stage/p01 || { echo "p01 missing: not warm"; exit 3; }
cp .stage/g9/p02 ~/stage/ && ls ~/stage | tr '\n' ' ' || exit 2
