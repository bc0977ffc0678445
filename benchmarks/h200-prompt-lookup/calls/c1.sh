#!/bin/bash
# Call 1 (fresh machine): stage the GGUF's first part and the shipped (thirteenth) drafter, the run's starting point.
# The repository travels without benchmarks/, results/ and treeflash/default_drafter (carried as .stage/d13).
mkdir -p ~/stage && cp .stage/a/part00 ~/stage/ && cp -r .stage/d13 ~/drafter0 && ls ~/stage ~/drafter0 || exit 2
nvidia-smi -L; python3 -c "import torch, triton; print(torch.__version__, triton.__version__)"; date
