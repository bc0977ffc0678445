#!/bin/bash
# Call 1: stage blob part p1 (the blob = smollm2.gguf.xz, sharegpt-all, code-prompts-all; the repository travels
# without benchmarks/ and results/) and keep the shipped (thirteenth) drafter as the run's starting point.
mkdir -p ~/stage && cp .stage/x15/a/p1 ~/stage/ && cp -r treeflash/default_drafter ~/drafter0 && ls -la ~/stage ~/drafter0 || exit 2
nvidia-smi -L; python3 -c "import torch, triton; print(torch.__version__, triton.__version__)"; date
