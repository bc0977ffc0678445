"""What prompt lookup costs on a GPU, op by op: `lookup` and `graft` timed apart as CUDA graph replays, and
the kernels of both by CUDA time (torch.profiler), at batch sizes and history widths of a real round; and
the one-kernel version a round runs on CUDA (treeflash/lookup_kernel.py) beside them, checked equal.

    python benchmarks/lookup_profile.py [--out FILE.json]

Random histories (a small vocabulary, so suffixes recur) and a DDTree-64 tree built from random
log-probabilities at block 16; 8 lookup tokens. Costs only: the tokens mean nothing.

Written for the question `h100-lookup-synthetic/` left open (why lookup costs 0.51 ms of a batch-32 round's
tree stage against 0.12 ms at batch 1); run on an H100 with the kernel beside the ops in
`benchmarks/gpu-lookup-kernel/call1/` (the ops' cost there is one `cumprod` scan).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from treeflash.lookup import graft, graft_lookup, lookup  # noqa: E402
from treeflash.tree import build_tree  # noqa: E402


def graphed_ms(fn, replays: int = 200) -> float:
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
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(replays):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / replays


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=None)
    parser.add_argument("--tokens", type=int, default=8)
    args = parser.parse_args()
    device = torch.device("cuda")
    gen = torch.Generator(device=device).manual_seed(0)
    rows = []
    for slots in (1, 32):
        for width in (1024, 8192):
            history = torch.randint(0, 50, (slots, width), device=device, generator=gen)
            seq_lens = torch.full((slots,), width // 2, device=device)
            bonus = torch.randint(0, 50, (slots,), device=device, generator=gen)
            logprobs = torch.randn(slots, 15, 50, device=device, generator=gen).log_softmax(-1)
            tree = build_tree(bonus, logprobs, budget=64)
            chain, ok = lookup(history, seq_lens, bonus, args.tokens)
            row = {"slots": slots, "width": width,
                   "lookup_ms": graphed_ms(lambda: lookup(history, seq_lens, bonus, args.tokens)),
                   "graft_ms": graphed_ms(lambda: graft(tree, chain, ok)),
                   "both_ms": graphed_ms(lambda: graft(tree, *lookup(history, seq_lens, bonus, args.tokens))),
                   "kernel_ms": graphed_ms(lambda: graft_lookup(tree, history, seq_lens, bonus, args.tokens,
                                                                kernel=True))}
            want = graft(tree, chain, ok)
            got = graft_lookup(tree, history, seq_lens, bonus, args.tokens, kernel=True)
            row["kernel_equal"] = all(torch.equal(getattr(got, f), getattr(want, f))
                                      for f in ("tokens", "parents", "depths", "valid", "scores"))
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
                for _ in range(20):
                    graft(tree, *lookup(history, seq_lens, bonus, args.tokens))
                torch.cuda.synchronize()
            kernels = sorted(((e.key, e.device_time_total / 20 / 1e3, e.count // 20) for e in prof.key_averages()
                              if e.device_time_total > 0), key=lambda k: -k[1])
            row["kernels"] = [{"name": k[:90], "ms": round(ms, 4), "calls": n} for k, ms, n in kernels[:12]]
            rows.append(row)
            print(f"slots {slots:>2} width {width:>5}: lookup {row['lookup_ms']:.3f} ms, graft {row['graft_ms']:.3f} ms, "
                  f"both {row['both_ms']:.3f} ms, one kernel {row['kernel_ms']:.3f} ms (equal: {row['kernel_equal']})",
                  flush=True)
            for k in row["kernels"][:6]:
                print(f"    {k['ms']:.4f} ms x{k['calls']}  {k['name']}")
    result = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "command": " ".join(sys.argv),
              "rows": rows}
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
