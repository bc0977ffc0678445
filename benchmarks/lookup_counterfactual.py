"""What prompt lookup would add to the rounds of a bench run without it, counted from its greedy outputs.

For every round of a method (default `ddtree:auto`) in a `treeflash bench` JSON (plain or gzipped): the
chain `lookup` would copy at the round's start (8 tokens after the latest earlier occurrence of the last 3,
else 2, else 1 tokens; "k" below is that suffix length, 0: no occurrence at all) against the tokens the
target went on to emit, and how many of them go past what the round accepted from the tree. Greedy runs
only (the emitted tokens are then the target's, whatever drafted). Prompts are re-encoded as the bench
encodes them (the embedded model's tokenizer and chat template unless --model).

    python benchmarks/lookup_counterfactual.py benchmarks/cpu-lookup-tokens/mtbench-n8.json.gz --dataset mtbench
"""

from __future__ import annotations

import argparse
import gzip
import json
from collections import defaultdict

from treeflash import LLM
from treeflash.bench.datasets import load_prompts
from treeflash.bench.run import _encode


def copied(seq: list[int], tokens: int) -> tuple[int, list[int]]:
    """(k, chain): the tokens after the latest earlier occurrence of seq's last k tokens, largest k in 3..1."""
    n = len(seq)
    for k in (3, 2, 1):
        for end in range(n - 2, k - 2, -1):  # an occurrence ending at `end`, its continuation inside seq
            if seq[end - k + 1:end + 1] == seq[n - k:]:
                return k, seq[end + 1:end + 1 + tokens]
    return 0, []


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("result", help="a treeflash bench JSON (.json or .json.gz) of a greedy run")
    ap.add_argument("--dataset", required=True, help="the run's --dataset")
    ap.add_argument("--method", default="ddtree:auto")
    ap.add_argument("--model", default=None, help="the run's --model (default: the embedded one)")
    ap.add_argument("--tokens", type=int, default=8, help="lookup tokens a round (default 8)")
    args = ap.parse_args()
    opener = gzip.open if args.result.endswith(".gz") else open
    with opener(args.result, "rt") as f:
        result = json.load(f)
    run = next(m for m in result["methods"] if m["method"] == args.method)
    prompts = load_prompts(args.dataset, len(run["per_prompt"]))
    llm = LLM(args.model, spec="none", device="cpu")
    by_k = defaultdict(lambda: [0, 0, 0])  # k -> rounds, tokens past the tree's, chain tokens matched
    rounds = emitted = 0
    for prompt, done in zip(prompts, run["per_prompt"]):
        seq = _encode(llm, prompt) + done["token_ids"]
        root = len(seq) - len(done["token_ids"])  # the first generated token is the first round's root
        for length in done["acceptance_lengths"]:
            k, chain = copied(seq[:root + 1], args.tokens)
            truth = seq[root + 1:]
            matched = next((i for i, (a, b) in enumerate(zip(chain, truth)) if a != b), min(len(chain), len(truth)))
            counts = by_k[k]
            counts[0] += 1
            counts[1] += max(0, matched - (length - 1))
            counts[2] += matched
            rounds, emitted, root = rounds + 1, emitted + length, root + length
    print(f"{args.dataset}, {args.method}: {rounds} rounds, {emitted / rounds:.3f} tokens a round")
    for k in sorted(by_k):
        r, extra, matched = by_k[k]
        print(f"  k={k}: {r} rounds ({100 * r / rounds:.0f}%), chain tokens matched {matched / r:.3f}, "
              f"past the tree {extra / r:.3f} a round")
    print(f"  lookup would add {sum(c[1] for c in by_k.values()) / rounds:.3f} tokens a round")


if __name__ == "__main__":
    main()
