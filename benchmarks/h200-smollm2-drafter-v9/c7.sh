#!/bin/bash
# Call 7: stage blob part p06.
test -f ~/stage/p05 || { echo "p05 missing: not warm"; exit 3; }
cp .stage/g9/p06 ~/stage/ && ls ~/stage | tr '\n' ' ' || exit 2
