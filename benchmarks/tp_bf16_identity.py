"""Tensor parallelism's token equality by dtype: tensor_parallel_size=2 against 1 on a tiny random Qwen3
(CPU, gloo), greedy, in float32 and bfloat16. In bfloat16 each rank rounds its partial o_proj / down_proj
products before the all-reduce adds them, where one process rounds the whole sum once.

    python benchmarks/tp_bf16_identity.py benchmarks/tp_bf16_identity.json
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from run_info import run_info  # noqa: E402

PROMPTS = [[3, 5, 7, 11], [2, 4, 6], [9, 8, 7, 6, 5, 4, 3, 2, 1], [10, 20, 30], [1, 2], [40, 41, 42]]


def main(out: str) -> None:
    from helpers import make_tiny_target  # tests/helpers.py
    from treeflash import LLM, SamplingParams

    torch.set_num_threads(1)
    greedy = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    result = {"command": "python " + " ".join(sys.argv), **run_info(torch.device("cpu")),
              "model": "tiny random Qwen3 (tests/helpers.make_tiny_target(..., 'qwen3'), seed 0)",
              "prompts": len(PROMPTS), "max_tokens": 40, "dtypes": {}}
    with tempfile.TemporaryDirectory() as tmp:
        target = make_tiny_target(Path(tmp) / "qwen3", "qwen3")
        for dtype in ("float32", "bfloat16"):
            outputs = {}
            for size in (1, 2):
                with LLM(str(target), device="cpu", dtype=dtype, max_num_seqs=1, tensor_parallel_size=size) as llm:
                    outputs[size] = [o.token_ids for o in llm.generate(prompt_token_ids=PROMPTS, sampling_params=greedy,
                                                                         use_tqdm=False)]
            equal = [a == b for a, b in zip(outputs[1], outputs[2])]
            first = [next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)
                     for a, b in zip(outputs[1], outputs[2])]
            result["dtypes"][dtype] = {"equal": sum(equal), "of": len(equal), "first_divergence": first}
            print(f"{dtype}: {sum(equal)} of {len(equal)} outputs equal; first divergence {first}")
    Path(out).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "tp_bf16_identity.json")
