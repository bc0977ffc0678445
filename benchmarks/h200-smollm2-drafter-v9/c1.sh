#!/bin/bash
# Call 1: wheels; stage blob part p00 (the blob = smollm2.gguf, v6-data.tgz, sharegpt-all, code-prompts;
# 16 MB parts: a part, the wheels and the repository (~46 MB) must stay under the 64 MiB a call carries).
mkdir -p ~/stage && cp .stage/g9/p00 ~/stage/ && ls -la ~/stage || exit 2
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
