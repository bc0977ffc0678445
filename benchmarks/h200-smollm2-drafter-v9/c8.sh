#!/bin/bash
# Call 8: stage blob part p07.
test -f ~/stage/p06 || { echo "p06 missing: not warm"; exit 3; }
cp .stage/g9/p07 ~/stage/ && ls ~/stage | tr '\n' ' ' || exit 2
