"""Time to first token with prefix reuse on and off, at a real shape (random bf16 weights) on a GPU.

  python benchmarks/gpu-prefix-reuse/ttft.py --shape qwen3-8b --system-tokens 4096 --out ttft.json

Requests of one long system prompt (--system-tokens random tokens) and a short user part (--user-tokens)
each, one at a time through two engines of one slot on the same weights (DDTree-64 with the shape's 5-layer
drafter, CUDA graphs, overlap), one with `prefix_reuse` off: each engine's first request prefills
everything (not counted); each later one, whose user part differs, finds the system prompt's whole
512-token chunks in the slot (reuse on) or prefills them again (reuse off), alternately, --pairs times.
Reports each request's prefill seconds (its prefill forwards and first token) and time to its first token
(from submission), and checks that both settings give the same tokens.

With --together N: engines of N slots, and N requests submitted at once under one system prompt that no
slot holds (a new one each time, --pairs times, after a first batch that captures the graphs): with reuse
on, the first request prefills each shared chunk and the others take it from its slot a step later; off,
each prefills it. Reports the time until every one of them has its first token, and the mean.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import gpu_check  # noqa: E402
from run_info import run_info  # noqa: E402
from treeflash.engine import Engine, EngineConfig, Request  # noqa: E402
from treeflash.round import SpecConfig  # noqa: E402
from treeflash.sampling import SamplingParams  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", default="qwen3-8b")
    ap.add_argument("--system-tokens", type=int, default=4096)
    ap.add_argument("--user-tokens", type=int, default=64)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--pairs", type=int, default=4)
    ap.add_argument("--together", type=int, default=1, help="requests submitted at once under a new system prompt")
    ap.add_argument("--prefill-chunk", type=int, default=512, help="(smaller for --shape tiny)")
    ap.add_argument("--out", default=None)
    ap.add_argument("--device", default="cuda", help="cuda; cpu (with --shape tiny) checks the script")
    args = ap.parse_args()

    gpu_check.DEVICE = args.device
    sync = torch.cuda.synchronize if args.device == "cuda" else (lambda: None)
    target, drafter = gpu_check.build_shape(args.shape)
    vocab = target.config.vocab_size
    config = EngineConfig(max_num_seqs=args.together, max_model_len=args.system_tokens + args.user_tokens + args.max_tokens + 64,
                          time_stages=False, prefill_chunk=args.prefill_chunk)
    spec = SpecConfig("ddtree", 64, ngram_tokens=8)
    engines = {reuse: Engine(target, drafter, spec, None, dataclasses.replace(config, prefix_reuse=reuse))
               for reuse in (True, False)}
    rng = torch.Generator().manual_seed(0)
    system = torch.randint(0, vocab, (args.system_tokens,), generator=rng).tolist()
    params = SamplingParams(temperature=0, max_tokens=args.max_tokens, ignore_eos=True)

    def ask(user: list[int], reuse: bool) -> dict:
        engine = engines[reuse]
        request = Request(len(rows), None, system + user, params, 0, frozenset(), args.max_tokens)
        sync()
        start, first = time.perf_counter(), None
        engine.add(request)
        while not request.finished:
            engine.step()
            if first is None and request.output_ids:
                first = time.perf_counter() - start
        return {"reuse": reuse, "ttft_s": first, "prefill_s": request.metrics.prefill_seconds,
                "cached_tokens": request.metrics.num_cached_tokens, "tokens": request.output_ids}

    rows: list[dict] = []
    if args.together > 1:
        return together(args, engines, rng, vocab, params, sync)
    users = [torch.randint(0, vocab, (args.user_tokens,), generator=rng).tolist() for _ in range(args.pairs + 1)]
    for reuse in (True, False):
        ask(users[0], reuse)  # (captures graphs, prefills the system prompt once; not counted)
    for user in users[1:]:
        for reuse in (True, False):
            rows.append({"user": users.index(user), **ask(user, reuse)})
            print({k: v for k, v in rows[-1].items() if k != "tokens"}, flush=True)
    on = [r for r in rows if r["reuse"]]
    off = [r for r in rows if not r["reuse"]]
    same = all(r["tokens"] == next(o for o in off if o["user"] == r["user"])["tokens"] for r in on)
    summary = {"median ttft s, reuse on": statistics.median(r["ttft_s"] for r in on),
               "median ttft s, reuse off": statistics.median(r["ttft_s"] for r in off),
               "median prefill s, reuse on": statistics.median(r["prefill_s"] for r in on),
               "median prefill s, reuse off": statistics.median(r["prefill_s"] for r in off),
               "cached tokens, reuse on": sorted({r["cached_tokens"] for r in on}), "same tokens": same}
    print(json.dumps(summary, indent=1))
    if args.out:
        report = {**run_info(torch.device(args.device)), "shape": args.shape, "system_tokens": args.system_tokens,
                  "user_tokens": args.user_tokens, "summary": summary, "rows": rows}
        Path(args.out).write_text(json.dumps(report, indent=1) + "\n")


def together(args, engines: dict, rng: torch.Generator, vocab: int, params: SamplingParams, sync) -> None:
    def batch(system: list[int], users: list[list[int]], reuse: bool) -> dict:
        engine = engines[reuse]
        requests = [Request(i, None, system + user, params, 0, frozenset(), args.max_tokens)
                    for i, user in enumerate(users)]
        sync()
        start, first = time.perf_counter(), {}
        for request in requests:
            engine.add(request)
        while not all(r.finished for r in requests):
            engine.step()
            now = time.perf_counter() - start
            first.update({r.id: now for r in requests if r.output_ids and r.id not in first})
        return {"reuse": reuse, "all_first_s": max(first.values()), "mean_ttft_s": statistics.mean(first.values()),
                "prefill_s": max(r.metrics.prefill_seconds for r in requests),
                "cached_tokens": [r.metrics.num_cached_tokens for r in requests],
                "tokens": [r.output_ids for r in requests]}

    def new(length: int) -> list[int]:
        return torch.randint(0, vocab, (length,), generator=rng).tolist()

    rows = []
    for i in range(args.pairs + 1):
        system, users = new(args.system_tokens), [new(args.user_tokens) for _ in range(args.together)]
        for reuse in (True, False):
            row = {"batch": i, **batch(system, users, reuse)}
            if i:  # (the first batch captures graphs: not counted)
                rows.append(row)
                print({k: v for k, v in row.items() if k != "tokens"}, flush=True)
    on = [r for r in rows if r["reuse"]]
    off = [r for r in rows if not r["reuse"]]
    summary = {f"median {what}, reuse {name}": statistics.median(r[key] for r in of)
               for key, what in (("all_first_s", "s until every first token"), ("mean_ttft_s", "mean ttft s"))
               for name, of in (("on", on), ("off", off))}
    summary["cached tokens, reuse on"] = on[0]["cached_tokens"]
    summary["same tokens"] = all(a["tokens"] == b["tokens"] for a, b in zip(on, off))
    print(json.dumps(summary, indent=1))
    if args.out:
        report = {**run_info(torch.device(args.device)), "shape": args.shape, "system_tokens": args.system_tokens,
                  "user_tokens": args.user_tokens, "together": args.together, "summary": summary, "rows": rows}
        Path(args.out).write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
