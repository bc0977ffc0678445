#!/bin/bash
# Staging only (ran as calls 5 and 7 of ../README.md): the GGUF's first part and a copy of the shipped drafter on a
# fresh machine; the rest comes with the next call (parts.sh or c5.sh): 64 MiB a call.
mkdir -p ~/stage && cp .stage/a/part00 ~/stage/ && cp -r .stage/d13 ~/drafter0 && ls ~/stage ~/drafter0
