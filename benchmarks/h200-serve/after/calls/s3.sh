#!/bin/bash
# Call A (after the fix): stage the GGUF's first part and the shipped drafter outside the repository copy.
mkdir -p ~/stage && cp .stage/a/part00 ~/stage/ && cp -r treeflash/default_drafter ~/d13 && ls ~/stage ~/d13 || exit 2
nvidia-smi -L; python3 -c "import torch, triton; print(torch.__version__, triton.__version__)"; date
