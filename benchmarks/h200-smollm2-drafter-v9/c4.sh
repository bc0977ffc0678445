#!/bin/bash
# Call 4: stage blob part p03.
test -f ~/stage/p02 || { echo "p02 missing: not warm"; exit 3; }
cp .stage/g9/p03 ~/stage/ && ls ~/stage | tr '\n' ' ' || exit 2
