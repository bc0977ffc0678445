#!/bin/bash
# Call 5: stage blob part p04.
test -f ~/stage/p03 || { echo "p03 missing: not warm"; exit 3; }
cp .stage/g9/p04 ~/stage/ && ls ~/stage | tr '\n' ' ' || exit 2
