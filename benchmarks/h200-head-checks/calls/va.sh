#!/bin/bash
# Call 2a (a fresh machine): stage the GGUF's first part and the shipped drafter (carried as .stage/d13).
mkdir -p ~/stage && cp .stage/a/part00 ~/stage/ && cp -r .stage/d13 ~/d13 && ls ~/stage ~/d13 || exit 2
nvidia-smi -L; date
