"""Load test for `treeflash serve`: N streaming chat clients for a fixed time, every answer checked offline.

  treeflash serve --max-num-seqs 32 &                      # the embedded model on 127.0.0.1:8000
  python benchmarks/serve_load.py --clients 64 --duration 60 --out benchmarks/serve/cpu_smollm2.json

Each client sends one streamed /v1/chat/completions request after another until the time is up (the
requests in flight then finish). Requests alternate between greedy and seeded sampling, over a fixed
set of short prompts and three lengths. Reported: requests/s and output tokens/s over the run, time to
first token (TTFT), inter-token latency (ITL: the gaps between streamed chunks; a speculative round's
tokens arrive together), time per output token per request (TPOT), and errors, which must be zero.
Then every answer is compared with the same request run offline through `LLM.chat` with plain decoding
(greedy and seeded requests are deterministic, and speculative decoding gives plain decoding's tokens):
a lost, truncated or mixed-up answer is a mismatch.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

PROMPTS = [
    "Name three trees that grow in cold climates.",
    "What is a KV cache, in one sentence?",
    "Write a haiku about autumn leaves.",
    "Give me two tips for writing clear code.",
    "What is the capital of Italy?",
    "Explain what a prime number is to a child.",
    "List four colours of the rainbow.",
    "Why is the sky blue? Answer briefly.",
    "Suggest a name for a friendly robot.",
    "What does a compiler do?",
    "Describe a forest at night in two sentences.",
    "How many legs does a spider have?",
    "Translate 'good morning' into French.",
    "What is photosynthesis?",
    "Write one sentence about the sea.",
    "Give an example of a renewable energy source.",
]
LENGTHS = (32, 48, 64)


@dataclass(frozen=True)
class Job:
    k: int  # the k-th request sent
    prompt: str
    max_tokens: int
    seed: int | None  # None: greedy

    def body(self, model: str) -> dict:
        body = {"model": model, "messages": [{"role": "user", "content": self.prompt}], "max_tokens": self.max_tokens,
                "stream": True, "stream_options": {"include_usage": True}}
        if self.seed is None:
            body["temperature"] = 0
        else:
            body.update(temperature=0.8, top_p=0.95, seed=self.seed)
        return body


def job(k: int) -> Job:
    return Job(k, PROMPTS[k % len(PROMPTS)], LENGTHS[(k // len(PROMPTS)) % len(LENGTHS)],
               None if k % 2 == 0 else 1000 + k)


@dataclass
class Result:
    job: Job
    start: float
    text: str = ""
    finish_reason: str | None = None
    completion_tokens: int = 0
    first: float | None = None  # time of the first chunk with text
    chunk_times: list[float] = field(default_factory=list)
    end: float | None = None
    error: str | None = None


async def one_request(client, url: str, model: str, headers: dict, item: Job) -> Result:
    result = Result(item, time.perf_counter())
    done = False
    try:
        async with client.stream("POST", url + "/v1/chat/completions", json=item.body(model), headers=headers) as r:
            if r.status_code != 200:
                result.error = f"HTTP {r.status_code}: {(await r.aread()).decode()[:200]}"
                return result
            async for line in r.aiter_lines():
                if not line.startswith("data: "):
                    continue
                data = line[len("data: "):]
                if data == "[DONE]":
                    done = True
                    break
                chunk = json.loads(data)
                if "error" in chunk:
                    result.error = f"error event: {chunk['error']}"
                    return result
                if chunk.get("usage"):
                    result.completion_tokens = chunk["usage"]["completion_tokens"]
                for choice in chunk["choices"]:
                    text = choice["delta"].get("content") or ""
                    if text:
                        now = time.perf_counter()
                        result.first = result.first or now
                        result.chunk_times.append(now)
                        result.text += text
                    if choice.get("finish_reason"):
                        result.finish_reason = choice["finish_reason"]
    except Exception as e:  # noqa: BLE001 (every failure is counted and shown, none is fatal)
        result.error = f"{type(e).__name__}: {e}"
        return result
    result.end = time.perf_counter()
    if not done:
        result.error = "the stream ended without data: [DONE]"
    elif result.finish_reason is None:
        result.error = "no finish_reason"
    return result


async def run_load(url: str, model: str, api_key: str | None, clients: int, duration: float) -> tuple[list, float]:
    import httpx

    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    counter = iter(range(10 ** 9))
    results: list[Result] = []
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    async with httpx.AsyncClient(timeout=httpx.Timeout(600.0), limits=limits) as client:
        start = time.perf_counter()
        deadline = start + duration

        async def client_loop():
            while time.perf_counter() < deadline:
                results.append(await one_request(client, url, model, headers, job(next(counter))))

        await asyncio.gather(*(client_loop() for _ in range(clients)))
        elapsed = time.perf_counter() - start
    return results, elapsed


def server_metrics(url: str, api_key: str | None) -> dict[str, float]:
    import httpx

    values = {}
    for line in httpx.get(url + "/metrics", timeout=30).text.splitlines():
        if line and not line.startswith("#") and "_bucket" not in line and "_created" not in line:
            name, value = line.rsplit(" ", 1)
            values[name] = float(value)
    return values


def percentiles(values: list[float], scale: float = 1000.0) -> dict:
    if not values:
        return {}
    a = np.asarray(values) * scale
    return {"p50": round(float(np.percentile(a, 50)), 1), "p90": round(float(np.percentile(a, 90)), 1),
            "p99": round(float(np.percentile(a, 99)), 1), "max": round(float(a.max()), 1),
            "mean": round(float(a.mean()), 1), "n": len(values)}


def check_offline(results: list[Result], model: str | None, max_num_seqs: int, spec: str = "none",
                  dtype: str | None = None) -> list[dict]:
    """Run every answered request offline (plain decoding by default: a speculative server must give
    exactly its tokens); return the answers that differ."""
    import torch

    from treeflash import LLM, SamplingParams
    from treeflash.cli import default_threads

    torch.set_num_threads(default_threads())  # all cores would spin against the server on a busy CPU
    answered = [r for r in results if r.error is None]
    jobs = sorted({r.job for r in answered}, key=lambda j: j.k)
    llm = LLM(model, max_num_seqs=max_num_seqs, spec=spec, dtype=dtype)
    params = [SamplingParams(temperature=0, max_tokens=j.max_tokens) if j.seed is None else
              SamplingParams(temperature=0.8, top_p=0.95, seed=j.seed, max_tokens=j.max_tokens) for j in jobs]
    outs = llm.chat([[{"role": "user", "content": j.prompt}] for j in jobs], params, use_tqdm=False)
    want = {j: (o.text, o.finish_reason, len(o.token_ids)) for j, o in zip(jobs, outs)}
    mismatches = []
    for r in answered:
        text, reason, tokens = want[r.job]
        if (r.text, r.finish_reason, r.completion_tokens) != (text, reason, tokens):
            at = next((i for i, (a, b) in enumerate(zip(r.text, text)) if a != b), min(len(r.text), len(text)))
            mismatches.append({"k": r.job.k, "seed": r.job.seed, "prompt": r.job.prompt, "first_difference": at,
                               "server": r.text, "offline": text, "server_finish": r.finish_reason,
                               "offline_finish": reason})
    return mismatches


def summarize(results: list[Result], elapsed: float, before: dict, after: dict) -> dict:
    ok = [r for r in results if r.error is None]
    tokens = sum(r.completion_tokens for r in ok)
    gaps = [b - a for r in ok for a, b in zip(r.chunk_times, r.chunk_times[1:])]
    tpot = [(r.chunk_times[-1] - r.first) / (r.completion_tokens - 1) for r in ok
            if r.first is not None and r.completion_tokens > 1]

    def delta(name: str) -> float:
        return after.get(name, 0.0) - before.get(name, 0.0)

    batches, rounds = delta("treeflash_batch_size_sum"), delta("treeflash_batch_size_count")
    accepted, accept_n = delta("treeflash_acceptance_length_sum"), delta("treeflash_acceptance_length_count")
    return {
        "requests_finished": len(ok), "errors": len(results) - len(ok),
        "error_examples": sorted({r.error for r in results if r.error})[:5],
        "elapsed_s": round(elapsed, 1), "requests_per_s": round(len(ok) / elapsed, 3),
        "output_tokens": tokens, "output_tokens_per_s": round(tokens / elapsed, 1),
        # An answer whose first token ends it (EOS) streams no text, so it has no time to first token.
        "empty_answers": sum(r.first is None for r in ok),
        "ttft_ms": percentiles([r.first - r.start for r in ok if r.first is not None]),
        "itl_ms": percentiles(gaps), "tpot_ms": percentiles(tpot),
        "e2e_ms": percentiles([r.end - r.start for r in ok]),
        "finish_reasons": {k: sum(r.finish_reason == k for r in ok) for k in ("stop", "length")},
        "server": {"mean_batch_size": round(batches / rounds, 2) if rounds else None,
                   "mean_acceptance_length": round(accepted / accept_n, 3) if accept_n else None,
                   "rounds": int(rounds)},
    }


def table(report: dict) -> str:
    s = report["summary"]
    rows = [("clients x duration", f"{report['clients']} x {report['duration_s']:g} s (ran {s['elapsed_s']} s)"),
            ("requests finished", s["requests_finished"]), ("errors", s["errors"]),
            ("mismatches vs offline", report.get("mismatches", "not checked")),
            ("requests/s", s["requests_per_s"]), ("output tokens/s", s["output_tokens_per_s"])]
    for key, label in (("ttft_ms", "TTFT ms"), ("itl_ms", "ITL ms"), ("tpot_ms", "TPOT ms")):
        p = s[key]
        if p:
            rows.append((label, f"p50 {p['p50']} / p90 {p['p90']} / p99 {p['p99']} / max {p['max']}"))
    rows.append(("server: mean batch, mean acceptance length",
                 f"{s['server']['mean_batch_size']}, {s['server']['mean_acceptance_length']}"))
    return "\n".join(["| measure | value |", "| --- | --- |"] + [f"| {a} | {b} |" for a, b in rows])


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", default="http://127.0.0.1:8000", help="the server (default http://127.0.0.1:8000)")
    ap.add_argument("--clients", type=int, default=64)
    ap.add_argument("--duration", type=float, default=60.0, help="seconds during which clients start requests")
    ap.add_argument("--api-key", default=None)
    ap.add_argument("--model", default=None, help="the served model, for the offline check (default: the embedded one)")
    ap.add_argument("--check-max-num-seqs", type=int, default=16, help="batch of the offline check")
    ap.add_argument("--check-spec", default="none", choices=("none", "dflash", "ddtree"),
                    help="decoding method of the offline check (default none: plain decoding)")
    ap.add_argument("--check-dtype", default=None, choices=("float32", "bfloat16", "float16"),
                    help="dtype of the offline check (default: LLM's, bfloat16 on CUDA). Only float32 gives a "
                         "batch's tokens exactly: compare a float32 server with a float32 check")
    ap.add_argument("--no-check", action="store_true", help="skip the offline comparison")
    ap.add_argument("--note", default="", help="free text stored with the result (e.g. what else ran)")
    ap.add_argument("--out", default=None, help="write the report (JSON) here")
    args = ap.parse_args(argv)

    import httpx
    import torch
    from run_info import run_info

    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    served = httpx.get(args.url + "/v1/models", headers=headers, timeout=30).json()["data"][0]["id"]
    before = server_metrics(args.url, args.api_key)
    results, elapsed = asyncio.run(run_load(args.url, served, args.api_key, args.clients, args.duration))
    after = server_metrics(args.url, args.api_key)
    report = {**run_info(torch.device("cpu")), "url": args.url, "served_model": served, "clients": args.clients,
              "duration_s": args.duration, "note": args.note, "summary": summarize(results, elapsed, before, after)}
    if not args.no_check:
        mismatched = check_offline(results, args.model, args.check_max_num_seqs, args.check_spec, args.check_dtype)
        report["check_spec"] = args.check_spec
        report["mismatches"] = len(mismatched)
        report["mismatch_examples"] = mismatched[:5]
    print(table(report))
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    return report


if __name__ == "__main__":
    main()
