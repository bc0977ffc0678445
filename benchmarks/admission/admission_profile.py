"""Where a batch-1 request's admission goes (prefill graph, first-token draw, read-back), A/B in one process.

Random weights at a real shape (`--shape`, as `treeflash bench --synthetic`), one slot, requests one after
another with a fixed prompt length and max_tokens, each timed from `Engine.add` to its end; `Engine._admit`
(the step's prefill + first token + read-back) timed on the host. Then, for ten more requests, the host clock
and a CUDA event at each boundary of the admission step (read after the step, so nothing extra synchronises),
and the prefill graph replayed alone. Variants, each a fresh engine over the same weights and prompts:
`default` (the engine as it is: the prefill forward's attention through the splitkv kernels, each piece's
slot passed in, where they fit; admission's host values copied through pinned memory, `treeflash/transfer.py`;
since the commit after 7f79228 the commit, lm_head and first-token draw inside the prefill graph),
`pageable` (those copies from pageable memory, which wait for the work queued on the device) and `dense`
(that, and the prefill's dense mask, gathered slot rows and SDPA). Until 7f79228 `dense` was named `before`
and was the engine before both changes; the draw's move into the graph has no variant here.

    python benchmarks/admission/admission_profile.py --shape smollm2-135m --spec ddtree:64 --out DIR
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

import treeflash.round as round_module
import treeflash.sampling as sampling_module
from treeflash import transfer
from treeflash.bench.methods import parse_methods
from treeflash.bench.shapes import build_drafter, build_target, drafter_config, shape, target_config
from treeflash.engine import Engine, EngineConfig, Request
from treeflash.round import Speculator
from treeflash.sampling import SamplingParams


def dense_prefill(sp: Speculator):
    """`prefill_forward` as it ran before: the dense-mask path, whatever the speculator's backend."""
    forward = sp.prefill_forward

    def run(*a, **k):
        backend, sp.attention = sp.attention, "sdpa"
        try:
            return forward(*a, **k)
        finally:
            sp.attention = backend
    return run


def pageable(values, device, dtype=None):
    """`to_device` as admission copied before: from pageable memory (CUDA waits for the queued work)."""
    return torch.tensor(values, dtype=dtype, device=device)


def measure(args, variant, target, drafter, method, vocab, device) -> dict:
    engine = Engine(target, drafter, method.spec_config(), None, EngineConfig(
        max_num_seqs=1, max_model_len=args.prompt_len + args.max_tokens + 64, time_stages=False))
    sp, runner = engine.speculator, engine.runner
    if variant == "dense":
        sp.prefill_forward = dense_prefill(sp)
    copies = pageable if variant in ("dense", "pageable") else transfer.to_device
    round_module.to_device = sampling_module.to_device = copies
    gen = torch.Generator().manual_seed(0)
    params = SamplingParams(temperature=args.temperature, max_tokens=args.max_tokens, ignore_eos=True,
                            detokenize=False)
    admit_host: list[float] = []
    original = engine._admit

    def timed_admit():
        t = time.perf_counter()
        out = original()
        if out:
            admit_host.append(time.perf_counter() - t)
        return out
    engine._admit = timed_admit

    def request(i: int) -> Request:
        ids = torch.randint(0, vocab, (args.prompt_len,), generator=gen).tolist()
        return Request(id=i, prompt=None, prompt_ids=ids, params=params, seed=i, stop_ids=frozenset(),
                       max_new_tokens=args.max_tokens)

    def finish(r: Request) -> None:
        while not r.finished:
            engine.step()
        while engine.has_work():
            engine.step()

    def one(i: int) -> float:
        r = request(i)
        t = time.perf_counter()
        engine.add(r)
        finish(r)
        return time.perf_counter() - t

    for i in range(3):  # captures
        one(i)
    admit_host.clear()
    walls = [one(100 + i) for i in range(args.requests)]
    med = statistics.median
    result = {"variant": variant, "request_ms": 1e3 * med(walls), "admit_ms": 1e3 * med(admit_host)}
    if device.type != "cuda":
        return result

    marks: list[tuple[str, float, torch.cuda.Event]] = []

    def mark(name: str) -> None:
        e = torch.cuda.Event(enable_timing=True)
        e.record()
        marks.append((name, time.perf_counter(), e))

    def wrapped(obj, name):
        f = getattr(obj, name)

        def g(*a, **k):
            mark(name + ">")
            out = f(*a, **k)
            mark(name + "<")
            return out
        setattr(obj, name, g)
    for obj, name in [(sp, "set_sampling_many"), (sp, "prefill_batch"), (runner, "prefill"), (engine, "_launch")]:
        wrapped(obj, name)
    pieces: dict[str, list[float]] = {}
    for i in range(10):
        marks.clear()
        r = request(300 + i)
        torch.cuda.synchronize()
        engine.add(r)
        mark("step>")
        engine.step()  # admission + the first round's launch (and, without overlap, its read)
        mark("step<")
        torch.cuda.synchronize()
        t0, e0 = marks[0][1], marks[0][2]
        for name, t, e in marks:
            pieces.setdefault(f"host {name}", []).append(1e3 * (t - t0))
            pieces.setdefault(f"gpu  {name}", []).append(e0.elapsed_time(e))
        finish(r)
    result["step_marks_ms"] = {k: round(med(v), 4) for k, v in pieces.items()}
    for key, g in runner.prefill_graphs.items():  # (slot 0's rows: the engine is idle now)
        torch.cuda.synchronize()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(20):
            g.graph.replay()
        b.record()
        torch.cuda.synchronize()
        result["prefill_graph_ms " + "x".join(map(str, key))] = round(a.elapsed_time(b) / 20, 4)
    return result


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="smollm2-135m")
    ap.add_argument("--spec", default="ddtree:64")
    ap.add_argument("--prompt-len", type=int, default=150)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--requests", type=int, default=30)
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--variants", default="default,pageable,dense")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--out", default=None, help="a JSON file")
    args = ap.parse_args(argv)
    device = torch.device(args.device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    s = shape(args.shape)
    tcfg = target_config(s)
    method = parse_methods(args.spec)[0]
    dcfg = drafter_config(tcfg, s.drafter_layers, s.block_size, s.mask_token_id, s.target_layer_ids)
    target = build_target(tcfg, device, dtype, seed=0)
    drafter = build_drafter(dcfg, device, dtype, seed=1) if method.spec != "none" else None
    try:
        rows = [measure(args, v, target, drafter, method, tcfg.vocab_size, device) for v in args.variants.split(",")]
    finally:  # (the variants swap the copies in)
        round_module.to_device = sampling_module.to_device = transfer.to_device
    result = {"shape": args.shape, "spec": args.spec, "prompt_len": args.prompt_len, "max_tokens": args.max_tokens,
              "requests": args.requests, "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
              "torch": torch.__version__, "rows": rows}
    print(json.dumps(result, indent=1))
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    return result


if __name__ == "__main__":
    main()
