"""Drafts under the request's own logit adjustments, or blind to them: acceptance and tokens/s, same tokens.

  python benchmarks/cpu-draft-adjustments/run.py --num-prompts 16 --max-tokens 128 \
      --out benchmarks/cpu-draft-adjustments/results.json

The default pair (SmolLM2-135M-Instruct + the shipped drafter, DDTree at the automatic budget, float32, this
machine's CPU) answers the first --num-prompts MT-Bench and HumanEval first turns greedily, one request at a
time, under each of three sets of adjustments: penalties (repetition 1.3, presence 0.5, frequency 0.3), a
logit bias that bans the three most frequent tokens of the unadjusted answers, and allowed_token_ids (the
tokens of those answers plus the stop token). Each set runs twice, interleaved per prompt: with the drafter's
logits adjusted as the target's are where that is known before the tree (`Speculator.adjust_drafts`, the
default) and without. Both give the same tokens (checked); the report gives tokens per round and tokens/s.
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
import time
from pathlib import Path


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--num-prompts", type=int, default=16, help="of each set")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)

    from treeflash import LLM, SamplingParams
    from treeflash.bench.datasets import load_prompts

    llm = LLM()
    prompts = [p for name in ("mtbench", "humaneval") for p in load_prompts(name, args.num_prompts)]
    ids = [llm.chat_token_ids(list(p.messages)) if p.is_chat else llm.encode(p.text) for p in prompts]
    base = SamplingParams(temperature=0, max_tokens=args.max_tokens)
    free = llm.generate(prompt_token_ids=ids, sampling_params=base, use_tqdm=False)
    counts = collections.Counter(t for o in free for t in o.token_ids)
    frequent = [t for t, _ in counts.most_common(3)]
    vocabulary = sorted(set(counts) | set(llm.eos_token_ids))
    sets = {"penalties": dict(repetition_penalty=1.3, presence_penalty=0.5, frequency_penalty=0.3),
            "logit_bias": dict(logit_bias={t: -100.0 for t in frequent}),
            "allowed_token_ids": dict(allowed_token_ids=vocabulary)}
    speculator = llm.engine.speculator
    report = {"command": "python " + " ".join(sys.argv), "prompts": len(ids), "max_tokens": args.max_tokens,
              "banned": frequent, "allowed": len(vocabulary), "sets": {}}
    for name, extra in sets.items():
        params = SamplingParams(temperature=0, max_tokens=args.max_tokens, **extra)
        runs = {True: [], False: []}
        for prompt in ids:
            for adjust in (True, False):
                speculator.adjust_drafts = adjust
                start = time.perf_counter()
                out = llm.generate(prompt_token_ids=[prompt], sampling_params=params, use_tqdm=False)[0]
                runs[adjust].append((out.token_ids, out.metrics.rounds, time.perf_counter() - start))
        speculator.adjust_drafts = True
        row = {"same_tokens": [r[0] for r in runs[True]] == [r[0] for r in runs[False]]}
        for adjust, label in ((True, "adjusted"), (False, "blind")):
            tokens = sum(len(r[0]) for r in runs[adjust])
            row[label] = {"tokens": tokens, "rounds": sum(r[1] for r in runs[adjust]),
                          "tokens_per_round": tokens / max(1, sum(r[1] for r in runs[adjust])),
                          "tokens_per_second": tokens / sum(r[2] for r in runs[adjust])}
        row["speedup"] = row["adjusted"]["tokens_per_second"] / row["blind"]["tokens_per_second"]
        report["sets"][name] = row
        print(f"{name}: same tokens {row['same_tokens']}; tokens per round {row['adjusted']['tokens_per_round']:.2f} "
              f"adjusted vs {row['blind']['tokens_per_round']:.2f} blind; tokens/s {row['adjusted']['tokens_per_second']:.1f}"
              f" vs {row['blind']['tokens_per_second']:.1f} ({row['speedup']:.3f}x)", flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    return report


if __name__ == "__main__":
    main()
