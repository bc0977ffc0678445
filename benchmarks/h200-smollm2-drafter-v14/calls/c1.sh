#!/bin/bash
# Call 1: stage blob part p1 (the blob = smollm2.gguf.xz, sharegpt-all, code-prompts-all; the repository travels
# without benchmarks/ and results/ so a part can be 40 MB) and keep the shipped (thirteenth) drafter.
mkdir -p ~/stage && cp .stage/x14/a/p1 ~/stage/ && cp -r treeflash/default_drafter ~/drafter0 && ls -la ~/stage ~/drafter0 || exit 2
nvidia-smi -L; date
