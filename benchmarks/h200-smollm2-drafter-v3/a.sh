#!/bin/bash
# Call A: stage GGUF part 1 and install the carried wheels (both survive while the machine stays warm).
mkdir -p ~/stage && cp .stage/g1/p00 ~/stage/ || exit 2
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader; ls -la ~/stage; date
