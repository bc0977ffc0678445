#!/bin/bash
# Call 1: stage blob part p1 (the blob = smollm2.gguf.xz, sharegpt-all, code-prompts; the repository travels
# without benchmarks/ and results/ so a part can be 40 MB) and keep the shipped (eleventh) drafter.
mkdir -p ~/stage && cp .stage/d10a/p1 ~/stage/ && cp -r treeflash/default_drafter ~/drafter0 && ls -la ~/stage ~/drafter0 || exit 2
nvidia-smi -L; date
