"""Eager rounds over the rows in use against rounds over the whole cache (the behaviour before), interleaved.

The default pair (SmolLM2-135M-Instruct + its drafter, float32, this CPU), greedy, HumanEval prompts: the
same LLM decodes each prompt with `kv_rows` passed to the eager round (now) and with it dropped (every round
over the whole cache, as before), alternating, first with the caches as one request leaves them and then
grown to the 8,192-token context (what one chat request without max_tokens grows them to on the server).

    python benchmarks/cpu-attention-width/ab.py --out benchmarks/cpu-attention-width/results.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from run_info import run_info  # noqa: E402

from treeflash import LLM, SamplingParams  # noqa: E402
from treeflash.bench.datasets import load_prompts  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--num-prompts", type=int, default=4)
    p.add_argument("--max-tokens", type=int, default=96)
    p.add_argument("--spec", default="ddtree")
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args()
    llm = LLM(spec=args.spec, dtype="float32", device="cpu")
    runner = llm.engine.runner
    narrow = runner.round
    whole = lambda num_slots, budget=None, kv_rows=None: narrow(num_slots, budget)  # noqa: E731
    params = SamplingParams(temperature=0, max_tokens=args.max_tokens, ignore_eos=True)
    prompts = [q.text for q in load_prompts("humaneval", args.num_prompts)]
    llm.generate(prompts[0], params)  # warm-up
    rows = []
    for cache in ("as grown by these requests", "grown to the whole context"):
        if cache.startswith("grown to"):
            llm.engine.speculator.reserve(llm.engine.max_capacity)
        for i, prompt in enumerate(prompts):
            for mode in (("rows in use", "whole cache") if i % 2 == 0 else ("whole cache", "rows in use")):
                runner.round = narrow if mode == "rows in use" else whole
                start = time.perf_counter()
                out = llm.generate(prompt, params)[0]
                seconds = time.perf_counter() - start
                rows.append({"cache": cache, "capacity": llm.engine.speculator.capacity, "prompt": i, "mode": mode,
                             "tokens": len(out.token_ids), "seconds": round(seconds, 4), "ids": out.token_ids})
    runner.round = narrow
    summary = {}
    for cache in ("as grown by these requests", "grown to the whole context"):
        per = {m: [r for r in rows if r["cache"] == cache and r["mode"] == m] for m in ("rows in use", "whole cache")}
        tps = {m: sum(r["tokens"] for r in rs) / sum(r["seconds"] for r in rs) for m, rs in per.items()}
        same = all(a["ids"] == b["ids"] for a, b in zip(sorted(per["rows in use"], key=lambda r: r["prompt"]),
                                                         sorted(per["whole cache"], key=lambda r: r["prompt"])))
        summary[cache] = {"capacity": per["whole cache"][0]["capacity"],
                          "tokens_per_s": {m: round(v, 2) for m, v in tps.items()},
                          "speedup": round(tps["rows in use"] / tps["whole cache"], 3), "same_tokens": same}
        print(cache, summary[cache])
    for r in rows:
        del r["ids"]
    args.out.write_text(json.dumps({"info": run_info(torch.device("cpu")), "command": "python " + " ".join(sys.argv),
                                    "threads": torch.get_num_threads(), "spec": args.spec, "summary": summary,
                                    "runs": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
