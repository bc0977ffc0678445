"""The splitkv attention kernels' launch settings against each other and FlexAttention, on a GPU.

For each target shape (query heads, KV heads, head dim), batch and number of new tokens (1: the AR step,
16: a draft block, 65 / 257: DDTree-64 / -256 trees) over `--context` committed rows in bfloat16: every
launch setting's output is checked against SDPA on the dense mask in float32, then the call as a round
makes it (the new K/V stored by the kernel) is captured in a CUDA graph and replayed; the median of 5 x
200 replays, microseconds per call. `flex_us` is the flex backend's call as a round makes it (the K/V
stored by `KVCache.extend`, then FlexAttention). Rows of one shape point share their inputs.

    python3 benchmarks/splitkv_ab.py [--baseline OLD_splitkv_attention.py] --out splitkv_ab.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

from tree_kernel_ab import load_module, time_graph
from treeflash.attention import attend, attend_new, round_layout
from treeflash.bench.shapes import shape, target_config
from treeflash.kv_cache import KVCache, append_layout
from treeflash.splitkv_attention import DEFAULT_LAUNCH, Launch, launch_for, splitkv_attention

# (max_block_m, block_n, num_warps, num_stages, programs_per_sm); the first is the default.
LAUNCHES = [
    (64, 64, 4, None, 2), (64, 64, 8, None, 2), (64, 64, 4, 2, 2), (64, 64, 8, 2, 2), (64, 32, 4, None, 2),
    (64, 128, 8, None, 2), (32, 64, 4, None, 2), (32, 64, 8, None, 2), (16, 64, 4, None, 2),
    (128, 64, 8, None, 2), (64, 64, 8, None, 4), (32, 64, 4, None, 4),
    (64, 128, 8, None, 4), (64, 128, 8, 3, 2), (64, 32, 4, None, 4), (128, 64, 8, None, 4), (128, 128, 8, None, 2),
    # one program per SM: if a head_dim-128 program fills an SM, 2 per SM in powers of two can make two waves
    (64, 128, 8, None, 1), (64, 32, 4, None, 1),
]


# --device cpu (Triton's interpreter): the checks alone, in float32.
DRY_RUN = {"dtype": torch.float32, "timer": lambda fn: (0.0, fn()), "flex": False}


def tree_mask(batch: int, t: int, gen: torch.Generator) -> torch.Tensor:
    """[B, T, T] ancestor-or-self masks of random trees (a chain for T = 1)."""
    mask = torch.eye(t, dtype=torch.bool).repeat(batch, 1, 1)
    for b in range(batch):
        for i in range(1, t):
            mask[b, i] |= mask[b, int(torch.randint(0, i, (1,), generator=gen))]
    return mask


def point(heads: int, kv_heads: int, head_dim: int, batch: int, t: int, context: int, launches, device,
          dtype=torch.bfloat16, timer=time_graph, flex: bool = True, baseline=None) -> dict:
    """One shape point: every launch's worst error against the float32 reference and its time (`timer`:
    fn -> (microseconds, output)); FlexAttention's too where `flex`, and `baseline.splitkv_attention`'s
    (another version of the module, its own launch) where given."""
    gen = torch.Generator().manual_seed(batch * 1000 + t)
    capacity = context + 512
    q = torch.randn(batch, heads, t, head_dim, generator=gen).to(device, dtype)
    new_k, new_v = (torch.randn(batch, kv_heads, t, head_dim, generator=gen).to(device, dtype) for _ in range(2))
    cache = KVCache.allocate(1, batch, kv_heads, capacity, head_dim, dtype, device)
    for tensor in cache.stacked:
        tensor.copy_(torch.randn(tensor.shape, generator=gen).to(dtype))
    seq_lens = torch.full((batch,), context, device=device)
    new_mask = tree_mask(batch, t, gen).to(device)
    rows, dense = append_layout(seq_lens, new_mask, capacity)
    want_k, want_v = cache.keys[0].float().clone(), cache.values[0].float().clone()
    for b in range(batch):
        want_k[b, :, rows[b]] = new_k[b].float()
        want_v[b, :, rows[b]] = new_v[b].float()
    want = attend(q.float(), want_k, want_v, dense)
    seq32, mask8 = seq_lens.to(torch.int32), new_mask.to(torch.uint8)
    out = {"heads": heads, "kv_heads": kv_heads, "head_dim": head_dim, "batch": batch, "new_tokens": t,
           "context": context, "launches": [],
           "launch_for": launch_for(head_dim, heads // kv_heads * t, batch=batch).__dict__}
    for launch in launches:
        def call(launch=launch):
            return splitkv_attention(q, cache.keys[0], cache.values[0], seq32, mask8, new_k, new_v, launch)
        err = (call().float() - want).abs().max().item()
        us, _ = timer(call)
        out["launches"].append({**launch.__dict__, "us": us, "max_abs_err": err})
    if baseline is not None:
        def call():
            return baseline.splitkv_attention(q, cache.keys[0], cache.values[0], seq32, mask8, new_k, new_v)
        out["baseline_max_abs_err"] = (call().float() - want).abs().max().item()
        out["baseline_us"], _ = timer(call)
    if flex:
        _, flex_mask = round_layout(seq_lens, new_mask, capacity, "flex")
        call = lambda: attend_new(q, new_k, new_v, cache, 0, rows, flex_mask)  # noqa: E731
        out["flex_max_abs_err"] = (call().float() - want).abs().max().item()
        out["flex_us"], _ = timer(call)
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shapes", default="qwen3-8b,smollm2-135m", help="benchmark shapes (treeflash.bench.shapes)")
    p.add_argument("--batches", default="1,8")
    p.add_argument("--new-tokens", default="1,16,65,257")
    p.add_argument("--context", type=int, default=1024)
    p.add_argument("--launches", type=int, default=len(LAUNCHES), help="the first N of LAUNCHES")
    p.add_argument("--baseline", help="another version of treeflash/splitkv_attention.py to time beside these")
    p.add_argument("--device", default="cuda", help="cuda; cpu only under TRITON_INTERPRET=1: a dry run in float32 "
                   "(the interpreter's bfloat16 is not the GPU's), no times, no FlexAttention")
    p.add_argument("--out", required=True)
    a = p.parse_args(argv)
    device = torch.device(a.device)
    cuda = device.type == "cuda"
    if not cuda:  # the tests' fix for Triton's interpreter on this NumPy
        sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
        from triton_interpreter import mend_interpreter
        mend_interpreter()
    launches = [Launch(m, n, w, s, sm) for m, n, w, s, sm in LAUNCHES[:a.launches]]
    baseline = load_module(a.baseline, "baseline_splitkv_attention") if a.baseline else None
    assert launches[0] == DEFAULT_LAUNCH
    for c in map(target_config, map(shape, a.shapes.split(","))):  # launch_for's picks are always timed
        picks = {launch_for(c.head_dim, c.num_heads // c.num_kv_heads * int(t), batch=int(b))
                 for t in a.new_tokens.split(",") for b in a.batches.split(",")}
        launches += [p for p in picks if p not in launches]
    result = {"device": torch.cuda.get_device_name(device) if cuda else "cpu", "torch": torch.__version__,
              "command": sys.argv,
              "rows": []}
    for name in a.shapes.split(","):
        c = target_config(shape(name))
        for batch in map(int, a.batches.split(",")):
            for t in map(int, a.new_tokens.split(",")):
                start = time.perf_counter()
                row = point(c.num_heads, c.num_kv_heads, c.head_dim, batch, t, a.context, launches, device,
                            baseline=baseline, **({} if cuda else DRY_RUN))
                row["shape"] = name
                result["rows"].append(row)
                best = min(row["launches"], key=lambda r: r["us"])
                picked = next(r for r in row["launches"] if {k: r[k] for k in row["launch_for"]} == row["launch_for"])
                base = f"baseline {row['baseline_us']:.1f}, " if baseline else ""
                flex = f"flex {row['flex_us']:.1f} us, " if "flex_us" in row else ""
                print(f"{name} batch {batch} T {t}: {flex}{base}default {row['launches'][0]['us']:.1f}, "
                      f"launch_for {picked['us']:.1f}, best {best['us']:.1f} ({best['max_block_m']}/{best['block_n']}/"
                      f"w{best['num_warps']}/s{best['num_stages']}/p{best['programs_per_sm']}); worst error "
                      f"{max(r['max_abs_err'] for r in row['launches']):.3g} ({time.perf_counter() - start:.0f} s)",
                      flush=True)
                with open(a.out, "w") as f:
                    json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
