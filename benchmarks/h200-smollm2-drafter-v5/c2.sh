#!/bin/bash
# Call 2: stage blob part 1.
test -f ~/stage/p00 || { echo "p00 missing: not warm"; exit 3; }
cp .stage/g5/p01 ~/stage/ && ls -la ~/stage
