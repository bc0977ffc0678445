#!/bin/bash
# Call 1 (staging only): the GGUF's first part and a copy of the shipped drafter on a fresh machine; the rest
# comes with call 2 (ab.sh): 64 MiB a call. Carry .stage/a, .stage/d13, .whl.
mkdir -p ~/stage && cp .stage/a/part00 ~/stage/ && cp -r .stage/d13 ~/drafter0 && ls ~/stage ~/drafter0
