"""Splits sized to a sliding window or to the cache's capacity: GPT-OSS-20B's window layers (64 query heads
over 8 KV heads, head_dim 64, a 128-row window, sinks), one call per layer over 12 layers' caches (out of L2
as in a round), one CUDA graph of the 12, replayed; microseconds per call. `python3 window_splits.py OUT.json`."""
import json
import sys

import torch

sys.path.insert(0, "benchmarks")
import treeflash.splitkv_attention as K  # noqa: E402
from tree_kernel_ab import time_graph  # noqa: E402

HEADS, KV_HEADS, HEAD_DIM, WINDOW, LAYERS = 64, 8, 64, 128, 12


def case(context: int, t: int) -> dict:
    gen = torch.Generator().manual_seed(context + t)
    dev, dtype = torch.device("cuda"), torch.bfloat16
    capacity = context + 512
    q = torch.randn(1, HEADS, t, HEAD_DIM, generator=gen).to(dev, dtype)
    new_k, new_v = (torch.randn(1, KV_HEADS, t, HEAD_DIM, generator=gen).to(dev, dtype) for _ in range(2))
    caches = [torch.randn(2, 1, KV_HEADS, capacity, HEAD_DIM, generator=gen).to(dev, dtype) for _ in range(LAYERS)]
    seq_lens = torch.full((1,), context, dtype=torch.int32, device=dev)
    depth = torch.arange(t).clamp_max(7)  # a tree's nodes: depths 0..7, each sees its ancestors (here: a chain)
    new_mask = (torch.ones(t, t).tril() > 0)[None].to(dev, torch.uint8)
    first = (context + depth - (WINDOW - 1)).clamp_min(0).to(torch.int32)[None].to(dev)
    sinks = torch.randn(HEADS, generator=gen).to(dev)
    row = {"context": context, "new_tokens": t}
    outs = []
    for window in (None, WINDOW):
        rows = HEADS // KV_HEADS * t
        launch = K.launch_for(HEAD_DIM, rows)
        block_m = min(launch.max_block_m, max(16, 1 << (rows - 1).bit_length()))
        programs = KV_HEADS * -(-rows // block_m)
        row[f"splits window={window}"] = K.num_splits(programs, capacity if window is None else WINDOW, dev, launch)

        def calls(window=window):
            return [K.splitkv_attention(q, c[0], c[1], seq_lens, new_mask, new_k, new_v, first=first, sinks=sinks,
                                        window=window) for c in caches]

        us, out = time_graph(calls)
        row[f"us/call window={window}"] = round(us / LAYERS, 2)
        outs.append(torch.stack(out).float())
    row["max |diff|"] = float((outs[0] - outs[1]).abs().max())
    return row


if __name__ == "__main__":
    rows = []
    for context in (1024, 8192):
        for t in (1, 16, 65):
            rows.append(case(context, t))
            print(json.dumps(rows[-1]), flush=True)
    json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": rows},
              open(sys.argv[1], "w"), indent=2)
