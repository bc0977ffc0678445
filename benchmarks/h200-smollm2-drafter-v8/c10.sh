#!/bin/bash
# Call 10: the benches (acceptance on every prompt, batch-1 speed, the shipped drafter's batch-1 speed in
# the same call), in order of importance; one tgz back.
S=$SECONDS
test -d ~/run/drafter || { echo "not warm"; exit 3; }
END=$((S + ${BUDGET:-570})) bash .stage/chain9/bench.sh
