#!/bin/bash
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
timeout 200 python3 .stage/tk/tkwarps.py $OUT/tkwarps.json 2>&1 | grep -v -i warn
timeout 150 python3 .stage/tk/norm_ab.py $OUT/norm_ab.json 2>&1 | grep -v -i warn
