"""Structured outputs with the default pair on the CPU: DDTree against plain decoding, same structured tokens.

  python benchmarks/cpu-structured/run.py --num-prompts 16 --max-tokens 128 \
      --out benchmarks/cpu-structured/results.json

The first --num-prompts MT-Bench first turns, each answered greedily, one request at a time, as a JSON object
{"answer": string} (a JSON-schema structure), by the target alone (`spec="none"`) and by the default pair
(SmolLM2-135M-Instruct + the shipped drafter, DDTree at the automatic budget) with drafts masked by the
structure (`Speculator.adjust_drafts`, the default) and blind to it, interleaved per prompt; then the same
prompts without a structure. Checks that every run gives the same tokens and that every structured reply that
ran to its end parses as the schema asks; reports tokens per round and tokens/s.
"""

from __future__ import annotations

import argparse
import json
import sys
import time


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--num-prompts", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)

    from treeflash import LLM, SamplingParams
    from treeflash.bench.datasets import load_prompts

    engines = {"none": LLM(spec="none"), "ddtree": LLM()}
    speculator = engines["ddtree"].engine.speculator
    runs_of = {"none": ("none", True), "ddtree": ("ddtree", True), "ddtree_blind": ("ddtree", False)}
    schema = {"type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"]}
    prompts = [list(p.messages) for p in load_prompts("mtbench", args.num_prompts)]
    report = {"command": "python " + " ".join(sys.argv), "prompts": len(prompts), "max_tokens": args.max_tokens,
              "schema": schema, "sets": {}}
    for label, structure in (("json_schema", {"json": schema}), ("free", None)):
        params = SamplingParams(temperature=0, max_tokens=args.max_tokens, structured_outputs=structure)
        for llm in engines.values():  # compile the structure and warm up outside the timed runs
            llm.chat(prompts[0], SamplingParams(temperature=0, max_tokens=4, structured_outputs=structure),
                     use_tqdm=False)
        names = list(runs_of) if structure is not None else ["none", "ddtree"]
        runs = {name: [] for name in names}
        for messages in prompts:
            for name in names:
                engine, speculator.adjust_drafts = runs_of[name]
                start = time.perf_counter()
                out = engines[engine].chat(messages, params, use_tqdm=False)[0]
                runs[name].append((out, time.perf_counter() - start))
        speculator.adjust_drafts = True
        tokens = {name: [o.token_ids for o, _ in r] for name, r in runs.items()}
        row = {"same_tokens": all(t == tokens["none"] for t in tokens.values())}
        if structure is not None:
            finished = [o for o, _ in runs["none"] if o.finish_reason == "stop"]
            row["finished"] = len(finished)
            row["finished_parse"] = all(isinstance(json.loads(o.text).get("answer"), str) for o in finished)
        for name, r in runs.items():
            generated = sum(len(o.token_ids) for o, _ in r)
            rounds = sum(o.metrics.rounds for o, _ in r)
            seconds = sum(t for _, t in r)
            row[name] = {"tokens": generated, "rounds": rounds, "tokens_per_round": round(generated / rounds, 3),
                         "seconds": round(seconds, 2), "tokens_per_s": round(generated / seconds, 2)}
        row["speedup"] = {name: round(row[name]["tokens_per_s"] / row["none"]["tokens_per_s"], 3)
                          for name in names[1:]}
        report["sets"][label] = row
        print(label, json.dumps(row), flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(report, f, indent=2)
            f.write("\n")
    return report


if __name__ == "__main__":
    main()
