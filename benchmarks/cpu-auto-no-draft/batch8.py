"""The default pair at 8 slots on the CPU, offline: what `treeflash serve`'s load script sends (48 chat
requests, half greedy, half seeded at temperature 0.8 / top_p 0.95, 32-64 tokens), through `LLM.chat`.

    python benchmarks/cpu-auto-no-draft/batch8.py [none] [--out FILE.json]

Prints tokens, seconds and tokens/s, and with the automatic budget the rounds per budget and the cost
profile it measured (ms per round by batch bucket and budget). Run from the tree whose code is measured
(PYTHONPATH picks it): the record's README runs an older tree beside this one, interleaved.
"""
import argparse
import collections
import json
import sys
import time
from pathlib import Path

import torch

from treeflash import LLM, SamplingParams  # (first: serve_load puts the repository's root on sys.path)

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the load script's requests
from serve_load import job  # noqa: E402

parser = argparse.ArgumentParser()
parser.add_argument("spec", nargs="?", default=None)
parser.add_argument("--requests", type=int, default=48)
parser.add_argument("--out")
args = parser.parse_args()
torch.set_num_threads(1)  # as `treeflash serve` on 2 cores
llm = LLM(spec=args.spec) if args.spec else LLM()
jobs = [job(k) for k in range(args.requests)]
convs = [[{"role": "user", "content": j.prompt}] for j in jobs]
params = [SamplingParams(temperature=0, max_tokens=j.max_tokens) if j.seed is None else
          SamplingParams(temperature=0.8, top_p=0.95, seed=j.seed, max_tokens=j.max_tokens) for j in jobs]
start = time.perf_counter()
outs = llm.chat(convs, params)
seconds = time.perf_counter() - start
tokens = sum(len(o.token_ids) for o in outs)
result = {"spec": args.spec or "default", "tokens": tokens, "seconds": seconds, "tokens_per_s": tokens / seconds,
          "token_ids": [o.token_ids for o in outs]}
line = f"{result['spec']}: {tokens} tokens in {seconds:.1f} s = {tokens / seconds:.1f} tokens/s"
if llm.engine.budget is not None:
    result["round_budgets"] = dict(sorted(collections.Counter(b for o in outs for b in o.metrics.round_budgets).items()))
    result["cost_ms"] = {s: {b: round(v * 1000, 1) for b, v in sorted(c.items())}
                         for s, c in sorted(llm.engine.budget.profile.seconds.items())}
    line += f"; request-rounds per budget {result['round_budgets']}; cost ms {result['cost_ms']}"
print(line + f" [{Path(sys.modules['treeflash'].__file__).parent}]", flush=True)
if args.out:
    Path(args.out).write_text(json.dumps(result))
