"""Attention of a draft block / tree over a long cache on the GPU: dense-mask SDPA vs FlexAttention.

At the Qwen3-8B attention shape (32 query heads, 8 KV heads, head dim 128, bf16) for T new tokens
(1 = a decode step, 16 = a DFlash block, 65 / 257 = a DDTree round at budget 64 / 256) after a
committed context of 1024 or 4096 rows, batch 1 and 8. The new tokens see the whole context plus
their ancestors in a random tree (the verify mask). Each variant runs the 36 layers' attention (one
K/V cache per layer, so nothing is served from L2) inside one CUDA graph; the table gives the median
replay time per layer, and the layout build (mask or block mask, once per forward) separately.

  sdpa_tight     dense bool mask over exactly context + T rows (the old kv_bound width: not graphable
                 across rounds, the lower bound of any dense-mask variant)
  sdpa_capacity  dense bool mask over the whole cache capacity (2 x context): graphable
  flex           FlexAttention block mask over the same capacity: graphable, skips blocks past
                 the context

  python benchmarks/attention/bench_attention.py --out benchmarks/attention/h200.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from treeflash.attention import attend, block_mask  # noqa: E402
from treeflash.kv_cache import append_layout  # noqa: E402

HEADS, KV_HEADS, HEAD_DIM, LAYERS = 32, 8, 128, 36
COPY_BANDWIDTH = 4.3e12  # bytes/s, measured device-to-device copy on this H200 (resources.md)


def tree_mask(batch: int, t: int, gen: torch.Generator) -> torch.Tensor:
    """[B, T, T] ancestor-or-self masks of random trees (parents precede children)."""
    masks = torch.zeros(batch, t, t, dtype=torch.bool)
    for b in range(batch):
        for i in range(t):
            masks[b, i, i] = True
            if i:
                parent = int(torch.randint(0, i, (1,), generator=gen))
                masks[b, i] |= masks[b, parent]
    return masks


def graph_time(fn, replays: int = 10) -> float:
    """Median seconds of one replay of a CUDA graph of fn (warmed up on a side stream first)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    for _ in range(3):
        graph.replay()
    times = []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return sorted(times)[len(times) // 2]


def one(context: int, batch: int, t: int, gen: torch.Generator) -> dict:
    capacity = 2 * context
    dev, dt = "cuda", torch.bfloat16
    seq = torch.full((batch,), context, device=dev)
    new = tree_mask(batch, t, gen).to(dev)
    q = torch.randn(batch, HEADS, t, HEAD_DIM, device=dev, dtype=dt)
    keys = [torch.randn(batch, KV_HEADS, capacity, HEAD_DIM, device=dev, dtype=dt) for _ in range(LAYERS)]
    values = [torch.randn(batch, KV_HEADS, capacity, HEAD_DIM, device=dev, dtype=dt) for _ in range(LAYERS)]
    out = {"context": context, "batch": batch, "new_tokens": t, "capacity": capacity}
    kv_bytes = batch * KV_HEADS * (context + t) * HEAD_DIM * 2 * 2
    out["kv_read_floor_us"] = 1e6 * kv_bytes / COPY_BANDWIDTH

    _, dense_cap = append_layout(seq, new, capacity)
    _, dense_tight = append_layout(seq, new, context + t)
    started = time.perf_counter()
    bm = block_mask(seq, new, capacity)
    ref = attend(q, keys[0], values[0], dense_cap).float()
    got = attend(q, keys[0], values[0], bm).float()
    out["flex_first_call_s"] = round(time.perf_counter() - started, 2)
    out["flex_rel_err"] = float((got - ref).norm() / ref.norm())
    tight = attend(q, keys[0][:, :, :context + t], values[0][:, :, :context + t], dense_tight).float()
    out["tight_rel_err"] = float((tight - ref).norm() / ref.norm())

    variants = {
        "sdpa_tight": (lambda: append_layout(seq, new, context + t), dense_tight, context + t),
        "sdpa_capacity": (lambda: append_layout(seq, new, capacity), dense_cap, capacity),
        "flex": (lambda: block_mask(seq, new, capacity), bm, capacity),
    }
    for name, (build, mask, width) in variants.items():
        def layers(mask=mask, width=width):
            for k, v in zip(keys, values):
                attend(q, k[:, :, :width], v[:, :, :width], mask)
        try:
            out[f"{name}_us_per_layer"] = 1e6 * graph_time(layers) / LAYERS
            out[f"{name}_layout_us"] = 1e6 * graph_time(build)
        except Exception as e:  # noqa: BLE001 - report and go on
            out[f"{name}_error"] = f"{type(e).__name__}: {e}"
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--contexts", default="1024,4096")
    ap.add_argument("--batches", default="1,8")
    ap.add_argument("--new-tokens", default="1,16,65,257")
    args = ap.parse_args()
    gen = torch.Generator().manual_seed(0)
    rows = []
    result = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "command": " ".join(sys.argv),
              "shape": {"heads": HEADS, "kv_heads": KV_HEADS, "head_dim": HEAD_DIM, "layers": LAYERS,
                        "dtype": "bfloat16"}, "rows": rows}
    for context in map(int, args.contexts.split(",")):
        for batch in map(int, args.batches.split(",")):
            for t in map(int, args.new_tokens.split(",")):
                row = one(context, batch, t, gen)
                rows.append(row)
                print(json.dumps(row), flush=True)
                args.out.write_text(json.dumps(result, indent=1))
                torch.cuda.empty_cache()
    print(f"{'ctx':>5} {'B':>2} {'T':>4} | {'tight':>7} {'capacity':>8} {'flex':>7} us/layer | "
          f"{'floor':>6} | layout us: {'dense':>6} {'flex':>6} | flex err")
    for r in rows:
        g = lambda k: r.get(k, float("nan"))  # noqa: E731
        print(f"{r['context']:>5} {r['batch']:>2} {r['new_tokens']:>4} | {g('sdpa_tight_us_per_layer'):7.1f} "
              f"{g('sdpa_capacity_us_per_layer'):8.1f} {g('flex_us_per_layer'):7.1f} | {r['kv_read_floor_us']:6.1f} | "
              f"{g('sdpa_capacity_layout_us'):6.1f} {g('flex_layout_us'):6.1f} | {r['flex_rel_err']:.1e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
