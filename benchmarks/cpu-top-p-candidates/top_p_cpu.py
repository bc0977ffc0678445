"""top_p on the CPU: the stable sort of every row against sorting only the candidates (sampling._top_p_candidates).
1. derive() alone at SmolLM2's vocabulary for 1-17 tree nodes; 2. the shipped pair end to end, DDTree at the
automatic budget with SmolLM2's recommended sampling (T=0.2, top_p=0.9), the two paths interleaved per prompt
on the same seeds (the tokens must agree), which path goes first alternating, after a warm-up.
    python benchmarks/cpu-top-p-candidates/top_p_cpu.py --out OUT.json"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from run_info import run_info  # noqa: E402
from treeflash import sampling  # noqa: E402
from treeflash.sampling import SamplingParams, SamplingTensors, derive  # noqa: E402


class FullSort:
    """Within the block, _top_p takes the full sort (CUDA's, the CPU's before) on the CPU too."""

    def __enter__(self):
        self.original, sampling._top_p_candidates = sampling._top_p_candidates, sampling._top_p_sorted

    def __exit__(self, *exc):
        sampling._top_p_candidates = self.original


def timed(fn, reps):
    fn()
    start = time.perf_counter()
    for _ in range(reps):
        fn()
    return (time.perf_counter() - start) / reps


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=64)
    args = ap.parse_args()
    out = {"run": run_info(torch.device("cpu")), "derive": [], "generate": []}
    params = SamplingParams(temperature=0.2, top_p=0.9)
    gen = torch.Generator().manual_seed(0)
    for nodes in (1, 9, 17):
        st = SamplingTensors.build([params], [1], "cpu")
        logits = torch.randn(1, nodes, 49152, generator=gen) * 3
        pos = torch.arange(nodes)[None] + 100
        with FullSort():
            sort_s = timed(lambda: derive(logits, st, pos), 10)
            want = derive(logits, st, pos)
        cand_s = timed(lambda: derive(logits, st, pos), 10)
        row = {"nodes": nodes, "full_sort_ms": sort_s * 1e3, "candidates_ms": cand_s * 1e3,
               "same_tokens": bool(torch.equal(want, derive(logits, st, pos)))}
        out["derive"].append(row)
        print(f"derive, {nodes} nodes x 49,152: full sort {row['full_sort_ms']:.2f} ms, candidates "
              f"{row['candidates_ms']:.2f} ms, same tokens {row['same_tokens']}", flush=True)
    from treeflash import LLM
    from treeflash.bench.datasets import load_prompts

    llm = LLM()  # the shipped pair, DDTree at the automatic budget
    prompts = load_prompts("mtbench")[::10][:args.prompts]
    p = SamplingParams(temperature=0.2, top_p=0.9, max_tokens=args.max_tokens, seed=0)
    # A warm-up: the automatic budget's first rounds on the CPU measure each candidate budget once.
    llm.chat([list(prompts[-1].messages)], SamplingParams(temperature=0.2, top_p=0.9, max_tokens=32, seed=1),
             use_tqdm=False)
    paths = (("full_sort", FullSort), ("candidates", None))
    for i, prompt in enumerate(prompts):
        messages = list(prompt.messages)
        row = {"prompt": prompt.id}
        for name, ctx in paths if i % 2 == 0 else paths[::-1]:  # alternate which goes first
            start = time.perf_counter()
            if ctx:
                with ctx():
                    res = llm.chat([messages], p, use_tqdm=False)[0]
            else:
                res = llm.chat([messages], p, use_tqdm=False)[0]
            row[name + "_s"] = time.perf_counter() - start
            row[name + "_tokens"] = list(res.token_ids)
        row["same_tokens"] = row["full_sort_tokens"] == row["candidates_tokens"]
        n = len(row["candidates_tokens"])
        print(f"{prompt.id}: {n} tokens, full sort {n / row['full_sort_s']:.2f} tok/s, candidates "
              f"{n / row['candidates_s']:.2f} tok/s, same tokens {row['same_tokens']}", flush=True)
        out["generate"].append(row)
        json.dump(out, open(args.out, "w"), indent=1)
    json.dump(out, open(args.out, "w"), indent=1)


if __name__ == "__main__":
    main()
