#!/bin/bash
# Call 9: stage blob part p08.
test -f ~/stage/p07 || { echo "p07 missing: not warm"; exit 3; }
cp .stage/g9/p08 ~/stage/ && ls ~/stage | tr '\n' ' ' || exit 2
