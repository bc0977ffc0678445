"""Prefix reuse on the CPU with the default pair when requests run together: a batch under one system
prompt, and a conversation's next turn while another conversation runs; reuse on and off, same tokens checked.

  python benchmarks/cpu-prefix-reuse/together.py --batch 8 --max-tokens 32 \
      --out benchmarks/cpu-prefix-reuse/together.json

batch: the first --batch MT-Bench questions, each under the same system prompt (the first --context-prompts
HumanEval prompts, as in run.py), in one `LLM.chat` call (max_num_seqs = --batch): they are admitted
together, before any of them has prefilled the system prompt.

conversations: two conversations at once, each with a system prompt of its own (HumanEval prompts k..2k-1
and 2k..3k-1, which the batch did not use). A's first turn (--max-tokens) and B's (four times as many tokens) run together; A's ends first
and its slot is free, below B's, while B's rounds go on. Then A's second turn runs, with B's second turn
beside it again. A's second turn can take its system prompt only from A's old slot.

Both through two `LLM`s of the default pair (SmolLM2-135M-Instruct + the shipped drafter, DDTree at the
automatic budget), one with `enable_prefix_caching=False`; greedy.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from run import _mtbench_two_turns  # noqa: E402
from run_info import run_info  # noqa: E402


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--context-prompts", type=int, default=12)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)

    from treeflash import LLM, SamplingParams
    from treeflash.bench.datasets import load_prompts

    code = [p.text for p in load_prompts("humaneval", 3 * args.context_prompts)]

    def system(part: list[str]) -> dict:
        return {"role": "system", "content": "You are a coding assistant. Our codebase has these functions:\n\n"
                + "\n".join(part)}

    k = args.context_prompts
    questions = _mtbench_two_turns(max(args.batch, 2))
    engines = {"reuse": LLM(max_num_seqs=args.batch), "no_reuse": LLM(max_num_seqs=args.batch,
                                                                      enable_prefix_caching=False)}
    short = SamplingParams(temperature=0, max_tokens=args.max_tokens)
    long = SamplingParams(temperature=0, max_tokens=4 * args.max_tokens)
    for llm in engines.values():  # warm up (and the automatic budget's first measurements) outside the timing
        llm.chat([{"role": "user", "content": "Hello."}], short, use_tqdm=False)

    def run(name: str, conversations: list[list[dict]], params) -> dict:
        llm = engines[name]
        before = llm.engine.stats.prefill_tokens, llm.engine.stats.prefill_seconds
        start = time.perf_counter()
        outs = llm.chat(conversations, params, use_tqdm=False)
        return {"seconds": time.perf_counter() - start,
                "prefill_tokens": llm.engine.stats.prefill_tokens - before[0],
                "prefill_seconds": llm.engine.stats.prefill_seconds - before[1],
                "prompt_tokens": [len(o.prompt_token_ids) for o in outs],
                "cached_tokens": [o.num_cached_tokens for o in outs], "outputs": outs}

    report = {**run_info(engines["reuse"].device), "max_tokens": args.max_tokens, "batch": args.batch}
    # batch: one call, every request under the same system prompt
    batch = [[system(code[:k]), {"role": "user", "content": first}] for first, _ in questions[:args.batch]]
    rows = {name: run(name, batch, short) for name in engines}
    report["batch"] = _summary(rows)
    print("batch:", json.dumps(report["batch"]), flush=True)

    # conversations: A (short replies) and B (long ones, another system prompt), two turns, together
    rows, history = {}, {}
    for name in engines:
        history[name] = [[system(code[k:2 * k]), {"role": "user", "content": questions[0][0]}],
                         [system(code[2 * k:3 * k]), {"role": "user", "content": questions[1][0]}]]
        rows[name] = []
        for turn in (1, 2):
            row = run(name, history[name], [short, long])
            rows[name].append(row)
            for h, o, (_, second) in zip(history[name], row["outputs"], questions[:2]):
                h += [{"role": "assistant", "content": o.outputs[0].text}, {"role": "user", "content": second}]
    report["conversations"] = {f"turn {t + 1}": _summary({n: rows[n][t] for n in engines}) for t in range(2)}
    print("conversations:", json.dumps(report["conversations"]), flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
    return report


def _summary(rows: dict) -> dict:
    on, off = rows["reuse"], rows["no_reuse"]
    same = [a.outputs[0].token_ids == b.outputs[0].token_ids for a, b in zip(on["outputs"], off["outputs"])]
    return {"same_tokens": all(same), "prompt_tokens": on["prompt_tokens"], "cached_tokens": on["cached_tokens"],
            **{f"{name} {what}": round(rows[name][what], 3) if isinstance(rows[name][what], float) else rows[name][what]
               for name in rows for what in ("prefill_tokens", "prefill_seconds", "seconds")}}


if __name__ == "__main__":
    main()
