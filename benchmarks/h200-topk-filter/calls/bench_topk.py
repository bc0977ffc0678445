"""`top_k_fast` against `tree_kernel.top_k_kernel` on a GPU: the same outputs, bit for bit, and time per call.

For each point (slots, 15 depths, vocabulary, k, dtype) of random log-probs (log_softmax of normal logits
times 3): both functions' scores and tokens must be torch.equal (bf16 rows tie often; both rank ties by
the lower token), and equal to a stable sort's; then each call is captured in a CUDA graph and replayed
200 times x 5 batches (CUDA events), median microseconds per call. Then the rows that the timing's random
log-probs never make: heavy ties, rows of -inf, a few finite tokens, a top crowded into a few blocks, a
buffer too small (the fallback), strided input, under a graph too and many times over (the kernels hand
work on through atomic counters: a race would show as a difference some of the time).
A failure at one point is printed and recorded; the rest still runs.

    PYTHONPATH=$PWD python3 .stage/topk/bench_topk.py --out $OUT/topk.json
    PYTHONPATH=$PWD .venv/bin/python .stage/topk/bench_topk.py --device cpu --out /tmp/topk.json  # dry run

(.stage/ is git-ignored: a device run must carry .stage/topk.) `--device cpu` runs the checks through
Triton's interpreter on tiny shapes (~5 minutes) and times nothing. `--variants '[{"ratio": 16},
{"warps": [8, 8]}]'` times `top_k_fast` with those keywords too (tuning); `--also topk_fast_v1` checks and
times that module's `top_k_fast` too (the first version, measured). A CUDA error that breaks the context
(an illegal address) fails every later point as well: the first error is the one to read.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import platform
import statistics
import sys
import time
import traceback

PARSER = argparse.ArgumentParser(description=__doc__.splitlines()[0])
PARSER.add_argument("--out", required=True, help="JSON file to write")
PARSER.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
PARSER.add_argument("--slots", default="1,8,32")
PARSER.add_argument("--depths", type=int, default=15)
PARSER.add_argument("--vocabs", default="151936,49152")
PARSER.add_argument("--ks", default="16,32,64,256")
PARSER.add_argument("--dtypes", default="bfloat16,float32")
PARSER.add_argument("--reps", type=int, default=200)
PARSER.add_argument("--batches", type=int, default=5)
PARSER.add_argument("--variants", default="[]", help="JSON list of keyword dicts for top_k_fast, timed too")
PARSER.add_argument("--also", default="", help="other modules beside this script (e.g. topk_fast_v1) whose "
                    "top_k_fast is checked and timed too")
PARSER.add_argument("--no-base", action="store_true", help="time only top_k_fast (the check still runs)")
PARSER.add_argument("--skip-special", action="store_true", help="skip the special rows' checks")
ARGS = PARSER.parse_args()

if ARGS.device == "cpu":  # before any kernel module is imported: Triton reads it when a kernel is defined
    os.environ["TRITON_INTERPRET"] = "1"
    sys.path.insert(0, os.path.join(os.getcwd(), "tests"))
    from triton_interpreter import mend_interpreter

    mend_interpreter()

import torch
import triton
from treeflash.tree_kernel import top_k_kernel

from topk_fast import top_k_fast


def stable_top_k(lp: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    # Descending, equal scores by the lower token: a stable sort of the negated scores (+0.0: -0.0 as the
    # kernels give it). NaN-free inputs only.
    x = lp.float() + 0.0
    order = (-x).sort(dim=-1, stable=True).indices[..., :k]
    return x.gather(-1, order), order


def same(a, b) -> bool:
    return torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])


def time_graph(fn, reps: int, batches: int) -> float:
    """Median microseconds per call of fn, replayed from a CUDA graph."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(batches):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(reps):
            graph.replay()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / reps)
    return statistics.median(times)


def graphed_outputs(fn):
    """fn's outputs from a replay of its CUDA graph (after the static input was refilled by the caller)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn()
    return graph, out


def random_logprobs(slots, depths, vocab, dtype, seed, device):
    gen = torch.Generator(device=device).manual_seed(seed)
    lp = torch.randn(slots, depths, vocab, device=device, generator=gen).mul_(3)
    return lp.log_softmax(-1).to(dtype)


def timed(fn) -> float:
    return round(time_graph(fn, ARGS.reps, ARGS.batches), 2)


def record(results, entry):
    """Keep the entry; print it, a point as one readable line."""
    results.append(entry)
    if entry["kind"] != "point":
        print(json.dumps(entry), flush=True)
        return
    line = f"{entry['dtype']:>8} S={entry['slots']:<2} D={entry['depths']} V={entry['vocab']:<6} k={entry['k']:<3}"
    times = [f"{key[:-3]} {value:.1f}" for key, value in entry.items() if key.endswith("_us")]
    if times:
        line += " us: " + ", ".join(times)
    if "speedup" in entry:
        line += f" (x{entry['speedup']})"
    equal = [key[6:] for key, value in entry.items() if key.startswith("equal_") and value is False]
    line += f"  NOT EQUAL: {', '.join(equal)}" if equal else "  equal"
    if "error" in entry:
        line += f"  ERROR {entry['error'][:300]}"
    print(line, flush=True)


def timing_points(results, device, fast_fns, variants):
    cuda = device == "cuda"
    if cuda:
        slots_list = [int(s) for s in ARGS.slots.split(",")]
        vocabs = [int(v) for v in ARGS.vocabs.split(",")]
        ks = [int(k) for k in ARGS.ks.split(",")]
        depths = ARGS.depths
    else:  # the interpreter: tiny shapes, the same code paths
        slots_list, vocabs, ks, depths = [1, 2], [800, 200], [16, 40], 2
    # What each point times: the base, top_k_fast (and modules named by --also), top_k_fast with each variant.
    fns = dict(fast_fns)
    for i, kw in enumerate(variants):
        fns[f"fast_v{i}"] = lambda lp, k, kw=kw: top_k_fast(lp, k, **kw)
    for dtype_name in ARGS.dtypes.split(","):
        dtype = getattr(torch, dtype_name)
        for vocab in vocabs:
            for slots in slots_list:
                for k in ks:
                    entry = {"kind": "point", "dtype": dtype_name, "slots": slots, "depths": depths,
                             "vocab": vocab, "k": k}
                    try:
                        k = min(k, vocab)
                        lp = random_logprobs(slots, depths, vocab, dtype, 1000 * slots + k + vocab, device)
                        base = top_k_kernel(lp, k)
                        entry["equal_stable_sort"] = same(base, stable_top_k(lp, k))  # the base's own
                        for label, fn in fns.items():
                            entry[f"equal_{label}"] = same(fn(lp, k), base)
                        if cuda:
                            if not ARGS.no_base:
                                entry["base_us"] = timed(lambda lp=lp, k=k: top_k_kernel(lp, k))
                            for label, fn in fns.items():
                                entry[f"{label}_us"] = timed(lambda fn=fn, lp=lp, k=k: fn(lp, k))
                            if "base_us" in entry:
                                entry["speedup"] = round(entry["base_us"] / entry["fast_us"], 2)
                    except Exception as exc:  # noqa: BLE001  (record it, go on)
                        entry["error"] = f"{type(exc).__name__}: {exc}"
                        traceback.print_exc()
                    record(results, entry)


def special_rows(device):
    """(name, k, keywords, build): rows the timing's random ones never make; build() makes the log-probs
    (inside the caller's try: a failure to build is recorded like any other)."""
    cuda = device == "cuda"
    vocab, depths = (151936, 15) if cuda else (400, 3)
    gen = torch.Generator(device=device).manual_seed(7)

    def rand(slots=2, v=vocab, d=depths, scale=3.0):
        return (torch.randn(slots, d, v, device=device, generator=gen) * scale).log_softmax(-1)

    def ties():
        return (rand() * 2).round() / 2  # few distinct values: thousands of ties at every bound

    def neg_inf():
        lp = rand()
        lp[0, 0] = float("-inf")  # a row of -inf: every token ties at the bound
        lp[1, 1, : vocab // 2] = float("-inf")
        lp[1, 2, 5:] = float("-inf")  # five finite tokens, then the lowest -inf ones
        return lp

    def crowded(k):
        lp = rand()
        lp[:, :, vocab // 3:vocab // 3 + 4 * k] += 30.0  # the top k all in a few neighbouring blocks
        return lp.log_softmax(-1)

    def certain():
        lp = rand()
        lp[0, :, 3] = 0.0
        lp[0, :, 4] = -0.0  # a certain token (log-prob 0.0 and -0.0: both +0.0 in the key)
        return lp

    out = []
    for k in (16, 64, 256) if cuda else (8, 40):
        out += [(f"ties_half_steps_k{k}", k, {}, ties),
                (f"ties_bf16_k{k}", k, {}, lambda: rand(scale=1.0).to(torch.bfloat16)),
                (f"neg_inf_rows_k{k}", k, {}, neg_inf),
                (f"crowded_top_k{k}", k, {}, lambda k=k: crowded(k)),
                (f"fallback_capacity_k{k}", k, {"capacity": k}, rand),  # the buffer overflows: full ranking
                (f"strided_k{k}", k, {}, lambda: rand(d=2 * depths)[:, ::2]),
                (f"certain_tokens_k{k}", k, {}, certain)]
    small_v = 512 if cuda else 100
    out += [("k_equals_vocab", small_v, {}, lambda: rand(1, v=small_v)),
            ("k_most_of_vocab", 512 if cuda else 120, {}, lambda: rand(v=16384 if cuda else 160)),
            ("k_1", 1, {}, rand),
            ("k_not_pow2", 48, {}, rand),
            ("float16", 64, {}, lambda: rand().half())]
    return out


def special_checks(results, device, fast_fns):
    cuda = device == "cuda"
    for name, k, kw, build in special_rows(device):
        for label, fn in fast_fns.items():
            entry = {"kind": "special", "name": name, "impl": label, "k": k, "kwargs": kw}
            try:
                lp = build()
                entry.update(shape=list(lp.shape), dtype=str(lp.dtype).split(".")[-1])
                base = top_k_kernel(lp, k)
                fast = fn(lp, k, **kw)
                entry["equal"] = same(fast, base)
                entry["equal_stable_sort"] = same(fast, stable_top_k(lp, k))
                if cuda:
                    # Many calls and a graph: atomics hand work between programs, so a race would show as
                    # a difference now and then, not every time.
                    entry["repeat_equal"] = all(same(fn(lp, k, **kw), base) for _ in range(50))
                    static = lp.clone()
                    graph, out = graphed_outputs(lambda fn=fn, x=static, k=k, kw=kw: fn(x, k, **kw))
                    ok = True
                    for _ in range(20):
                        graph.replay()
                        ok = ok and same(out, base)
                    static.copy_(lp.flip(-1))  # new values, same graph
                    graph.replay()
                    entry["graph_equal"] = ok and same(out, top_k_kernel(static, k))
                    if any(word in name for word in ("fallback", "ties", "neg_inf", "crowded")):
                        entry["fast_us"] = round(time_graph(lambda fn=fn, lp=lp, k=k, kw=kw: fn(lp, k, **kw), 50, 3), 2)
            except Exception as exc:  # noqa: BLE001
                entry["error"] = f"{type(exc).__name__}: {exc}"
                traceback.print_exc()
            record(results, entry)


def main() -> None:
    device = ARGS.device
    if device == "cuda" and not torch.cuda.is_available():
        sys.exit("no CUDA device (use --device cpu for the interpreter's dry run)")
    variants = json.loads(ARGS.variants)
    fast_fns = {"fast": top_k_fast}
    for name in filter(None, ARGS.also.split(",")):  # other versions, from files beside this one
        fast_fns[name] = importlib.import_module(name).top_k_fast
    env = {"torch": torch.__version__, "triton": triton.__version__, "python": platform.python_version(),
           "device": torch.cuda.get_device_name() if device == "cuda" else "cpu (Triton interpreter)",
           "argv": sys.argv[1:], "variants": variants}
    print(json.dumps(env), flush=True)
    results = []
    started = time.time()
    timing_points(results, device, fast_fns, variants)
    if not ARGS.skip_special:
        special_checks(results, device, fast_fns)
    failed = [r for r in results if "error" in r or any(value is False for key, value in r.items()
                                                           if key.endswith("equal") or key.startswith("equal"))]
    summary = {"points": len(results), "failed": len(failed), "seconds": round(time.time() - started, 1)}
    print(json.dumps(summary), flush=True)
    with open(ARGS.out, "w") as f:
        json.dump({"env": env, "summary": summary, "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
