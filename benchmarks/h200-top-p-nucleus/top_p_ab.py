"""top-p's nucleus on CUDA: a Triton kernel against the stable sort `sampling._top_p` runs, same rows. Agreement
of the kept sets on real-sized rows, then CUDA-graph time of the cut alone and of a whole derive() with each.
PYTHONPATH=$PWD python3 benchmarks/h200-top-p-nucleus/top_p_ab.py OUT.json [--kernel v1|v2]
(v1: `nucleus_v1.py`, the measured one; v2: `nucleus.py`, which also sweeps its launches, CONFIGS.)"""
import argparse
import json
import os
import sys

import torch

here = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [here, os.path.join(here, "..")]
from tree_kernel_ab import time_graph  # noqa: E402  (CUDA-graph replays, the median of five batches)
from treeflash import sampling  # noqa: E402
from treeflash.sampling import SamplingParams, SamplingTensors, derive  # noqa: E402

CONFIGS = [(16, 256, 4), (8, 512, 4), (4, 1024, 8), (2, 1024, 8), (2, 512, 4)]  # v2's (ways, block, warps)


def sort_cut(probs, top_p):
    # sampling._top_p's sort, without the renormalisation.
    return probs.masked_fill(~sampling._top_p_sorted(probs, top_p), 0.0)


def derive_with(cut, logits, st, pos):
    """derive() with `_top_p` cutting by `cut` (then renormalising, as `_top_p` does)."""
    def top_p(probs, tp):
        vocab = probs.shape[-1]
        kept = cut(probs.reshape(-1, vocab), tp.expand(probs.shape[:-1]).reshape(-1)).view(probs.shape)
        return kept / kept.sum(-1, keepdim=True)

    original, sampling._top_p = sampling._top_p, top_p
    try:
        return derive(logits, st, pos)
    finally:
        sampling._top_p = original


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--kernel", choices=["v1", "v2"], default="v1")
    args = ap.parse_args()
    if args.kernel == "v1":
        from nucleus_v1 import top_p_nucleus
        configs = []
    else:
        from nucleus import top_p_nucleus
        configs = CONFIGS
    dev = torch.device("cuda")
    out = {"kernel": args.kernel, "agreement": [], "timing": []}
    gen = torch.Generator(device=dev).manual_seed(0)
    for vocab in (49152, 151936):
        for temperature, top_p in ((0.2, 0.9), (0.7, 0.9), (1.0, 0.95), (1.0, 0.5), (1.5, 0.99)):
            logits = torch.randn(512, vocab, device=dev, generator=gen) * 4
            probs = torch.softmax(logits / temperature, -1)
            tp = torch.full((512,), top_p, dtype=torch.float64, device=dev)
            a = sort_cut(probs, tp)
            b = top_p_nucleus(probs, tp)
            rows_differ = int(((a > 0) != (b > 0)).any(-1).sum())
            for cfg in configs:  # every launch timed below keeps the same tokens
                rows_differ += int(((a > 0) != (top_p_nucleus(probs, tp, *cfg) > 0)).any(-1).sum())
            kept = (a > 0).sum(-1).float()
            out["agreement"].append({"vocab": vocab, "temperature": temperature, "top_p": top_p, "rows": 512,
                                     "rows_differ": rows_differ, "values_equal": bool(torch.equal(a, b)),
                                     "kept_median": float(kept.median()), "kept_max": float(kept.max())})
            print(f"V={vocab} T={temperature} top_p={top_p}: rows differing {rows_differ}/512, values equal "
                  f"{torch.equal(a, b)}, kept tokens median {kept.median():.0f} max {kept.max():.0f}", flush=True)
    params = SamplingParams(temperature=0.7, top_p=0.9)
    for slots, nodes, vocab in ((1, 1, 49152), (1, 65, 49152), (32, 1, 49152), (1024, 1, 49152),
                                (1, 1, 151936), (1, 65, 151936), (8, 65, 151936)):
        st = SamplingTensors.build([params] * slots, list(range(slots)), dev)
        logits = torch.randn(slots, nodes, vocab, device=dev, dtype=torch.bfloat16) * 3
        pos = torch.arange(nodes, device=dev)[None].expand(slots, nodes) + 500
        probs = torch.softmax(logits.float().reshape(-1, vocab) / 0.7, -1)
        tp = torch.full((slots * nodes,), 0.9, dtype=torch.float64, device=dev)
        reps = 5 if slots * nodes * vocab > 2e7 else 30
        row = {"slots": slots, "nodes": nodes, "vocab": vocab,
               "sort_us": time_graph(lambda: sort_cut(probs, tp), reps=reps)[0],
               "kernel_us": time_graph(lambda: top_p_nucleus(probs, tp), reps=reps)[0],
               "derive_sort_us": time_graph(lambda: derive_with(sort_cut, logits, st, pos), reps=reps)[0],
               "derive_us": time_graph(lambda: derive_with(top_p_nucleus, logits, st, pos), reps=reps)[0],
               "same_tokens": bool(torch.equal(derive_with(sort_cut, logits, st, pos),
                                               derive_with(top_p_nucleus, logits, st, pos)))}
        row["configs_us"] = {str(cfg): time_graph(lambda: top_p_nucleus(probs, tp, *cfg), reps=reps)[0]
                             for cfg in configs}
        out["timing"].append(row)
        if configs:
            swept = ", ".join(f"{k} {v:.1f}" for k, v in row["configs_us"].items())
            print(f"   launches (ways, block, warps): {swept}")
        print(f"S={slots} N={nodes} V={vocab}: cut sort {row['sort_us']:.1f} us, kernel {row['kernel_us']:.1f} us; "
              f"derive {row['derive_sort_us']:.1f} -> {row['derive_us']:.1f} us; same tokens {row['same_tokens']}",
              flush=True)
        json.dump(out, open(args.out, "w"), indent=1)


if __name__ == "__main__":
    main()
