"""DDTree's Triton tree builder against another version of it, on a GPU: same trees, time per build.

For each (slots, budget) at the drafter's shape (15 depths, a 16,384-token draft vocabulary), random
log-probs: both builders' trees must equal `tree.build_tree`'s field for field (eager and replayed
from a CUDA graph), then each build (top-k + kernel, as a round runs it) is captured in a CUDA graph
and replayed back to back; the median of 5 batches of 200 replays, microseconds per build. `ops_us`
times `tree.build_tree` itself (torch ops: what a round runs past the kernel's budgets). Rows in
bfloat16 (a round's draft log-probs) are timed only: their ties make top-k orders differ.
`topk_us` times torch's `lp.float().topk` alone, `top_k_kernel_us` this checkout's own top-k, `top_k_pieces_pN_us`
its pieces method with each row in N pieces and `top_k_filter_us` its filter method (treeflash/top_k.py).

    python3 benchmarks/tree_kernel_ab.py --baseline OLD_tree_kernel.py --out ab.json
    python3 benchmarks/tree_kernel_ab.py --budgets 64,128,256,512 --slots 1 --vocab 151936 --out big.json
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import sys

import torch

from treeflash import top_k, tree_kernel
from treeflash.tree import build_tree

FIELDS = ("tokens", "parents", "depths", "valid", "scores", "ranked_scores")


def load_module(path: str, name: str = "baseline_tree_kernel"):
    """Another version of a module, from its file (registered under `name`: dataclasses look it up)."""
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def same(a, b) -> bool:
    return all(torch.equal(getattr(a, f), getattr(b, f)) for f in FIELDS)


def time_graph(fn, reps: int = 200, batches: int = 5) -> tuple[float, object]:
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn()
    times = []
    for _ in range(batches):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(reps):
            graph.replay()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / reps)
    return statistics.median(times), out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--baseline", help="a tree_kernel.py to compare with this checkout's (default: none)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--depths", type=int, default=15)
    ap.add_argument("--vocab", type=int, default=16384)
    ap.add_argument("--budgets", default="16,32,64")
    ap.add_argument("--slots", default="1,8")
    args = ap.parse_args()
    builders = {"this": tree_kernel.build_tree_kernel, "ops": build_tree}
    if args.baseline:
        builders["baseline"] = load_module(args.baseline).build_tree_kernel
    rows = []
    for dtype in (torch.float32, torch.bfloat16):
        for slots in map(int, args.slots.split(",")):
            for budget in map(int, args.budgets.split(",")):
                gen = torch.Generator(device="cuda").manual_seed(budget * 100 + slots)
                lp = torch.randn(slots, args.depths, args.vocab, device="cuda", generator=gen).mul_(3)
                lp = lp.log_softmax(-1).to(dtype)
                bonus = torch.arange(slots, device="cuda")
                want = build_tree(bonus, lp, budget) if dtype == torch.float32 else None
                row = {"dtype": str(dtype).removeprefix("torch."), "slots": slots, "budget": budget}
                row["topk_us"], _ = time_graph(lambda: lp.float().topk(budget, dim=-1))
                row["top_k_kernel_us"], _ = time_graph(lambda: top_k.top_k_kernel(lp, budget))
                for pieces in (1, 4, 16):
                    row[f"top_k_pieces_p{pieces}_us"], _ = time_graph(lambda: top_k.top_k_pieces(lp, budget, pieces))
                row["top_k_filter_us"], _ = time_graph(lambda: top_k.top_k_filter(lp, budget))
                for name, build in builders.items():
                    eager = build(bonus, lp, budget)
                    us, replayed = time_graph(lambda: build(bonus, lp, budget))
                    row[f"{name}_us"] = us
                    row[f"{name}_equal"] = None if want is None else same(eager, want) and same(replayed, want)
                rows.append(row)
                print(json.dumps(row), flush=True)
    json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__, "args": vars(args), "rows": rows},
              open(args.out, "w"), indent=1)


if __name__ == "__main__":
    main()
