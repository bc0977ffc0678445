"""top_p's sort in groups of rows (`sampling._top_p_sorted`, at most 2^24-2^27 elements a group; the default
TOP_P_SORT_ELEMENTS) against one sort of every row (the code before): equal masks, time and the allocator's peak
per call, at a round's shapes on a GPU.

    python benchmarks/h200-graph-pool/top_p_chunks.py out.json
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from treeflash import sampling  # noqa: E402


def whole(probs: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """The code before: every row sorted at once."""
    ascending, order = probs.sort(dim=-1, stable=True)
    below = ascending.cumsum(-1, dtype=torch.float64)
    total = below[..., -1:]
    above = total - below
    keep_sorted = (above < top_p[..., None] * total) | (top_p >= 1)[..., None]
    return torch.empty_like(keep_sorted).scatter_(-1, order, keep_sorted)


def measure(fn, probs, top_p, repeats: int = 5) -> tuple[torch.Tensor, float, float]:
    out = fn(probs, top_p)  # warm-up
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        out = fn(probs, top_p)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    peak = (torch.cuda.max_memory_allocated() - base) / 2 ** 30
    return out, sorted(times)[len(times) // 2], peak


def main() -> None:
    gen = torch.Generator(device="cuda").manual_seed(0)
    rows = []
    for nodes, vocab in [(65, 49152), (520, 49152), (4128, 49152), (65, 151936), (520, 151936), (4128, 151936)]:
        logits = torch.randn(nodes, vocab, device="cuda", generator=gen) * 3
        probs = torch.softmax(logits, -1)
        del logits
        top_p = torch.full((nodes,), 0.9, dtype=torch.float64, device="cuda")
        top_p[::7] = 1.0
        a, ms, gib = measure(whole, probs, top_p)
        row = {"nodes": nodes, "vocab": vocab, "whole": {"ms": round(ms, 3), "peak_gib": round(gib, 3)}}
        for log2 in (24, 25, 26, 27):  # the bound on elements sorted at once (the default: TOP_P_SORT_ELEMENTS)
            b, ms, gib = measure(lambda x, t: sampling._top_p_sorted(x, t, 1 << log2), probs, top_p)
            row[f"2^{log2}"] = {"equal": bool(torch.equal(a, b)), "ms": round(ms, 3), "peak_gib": round(gib, 3)}
            del b
        print(json.dumps(row), flush=True)
        rows.append(row)
        del a, probs
        torch.cuda.empty_cache()
    Path(sys.argv[1]).write_text(json.dumps({"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                                             "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
