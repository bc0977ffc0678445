#!/bin/bash
# Call 4: stage the GGUF's first part and a copy of the shipped drafter on a fresh machine (the rest comes
# with call 5: 64 MiB a call).
mkdir -p ~/stage && cp .stage/a/part00 ~/stage/ && cp -r .stage/d13 ~/drafter0 && ls ~/stage ~/drafter0
