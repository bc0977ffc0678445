"""Inductor's compiled add_rms_norm against a hand-written one-program-per-row Triton kernel (CUDA graphs)."""
import json, statistics, sys
import torch, triton, triton.language as tl
from treeflash.models.kernels import COMPILED, add_rms_norm


@triton.jit
def _add_rms_norm(X, Delta, W, Total, Normed, D, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    ok = cols < D
    x = tl.load(X + row * D + cols, mask=ok, other=0.0)
    x = (x.to(tl.float32) + tl.load(Delta + row * D + cols, mask=ok, other=0.0).to(tl.float32)).to(x.dtype)
    tl.store(Total + row * D + cols, x, mask=ok)
    h = x.to(tl.float32)
    r = tl.rsqrt(tl.sum(h * h, 0) / D + eps)
    w = tl.load(W + cols, mask=ok, other=0.0)
    tl.store(Normed + row * D + cols, (w.to(tl.float32) * (h * r).to(x.dtype).to(tl.float32)).to(x.dtype), mask=ok)


def hand(x, delta, w, eps, warps):
    n, d = x.shape
    total, normed = torch.empty_like(x), torch.empty_like(x)
    _add_rms_norm[(n,)](x, delta, w, total, normed, d, eps, BLOCK=triton.next_power_of_2(d), num_warps=warps)
    return total, normed


def time_graph(fn, reps=100, batches=5):
    s = torch.cuda.Stream(); s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    ts = []
    for _ in range(batches):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(reps):
            g.replay()
        b.record(); torch.cuda.synchronize()
        ts.append(a.elapsed_time(b) * 1e3 / reps)
    return statistics.median(ts)


rows = []
layers = 36
for d in (4096, 576):
    for n in (1, 16, 65, 257):
        xs = [torch.randn(n, d, device="cuda", dtype=torch.bfloat16) for _ in range(layers)]
        ds = [torch.randn(n, d, device="cuda", dtype=torch.bfloat16) for _ in range(layers)]
        w = torch.randn(d, device="cuda", dtype=torch.bfloat16)
        row = {"d": d, "rows": n}
        want = [add_rms_norm(x, dd, w, 1e-6) for x, dd in zip(xs, ds)]
        row["inductor_us"] = time_graph(lambda: [COMPILED.add_rms_norm(x, dd, w, 1e-6) for x, dd in zip(xs, ds)]) / layers
        for warps in (1, 2, 4, 8):
            got = [hand(x, dd, w, 1e-6, warps) for x, dd in zip(xs, ds)]
            row[f"hand_w{warps}_us"] = time_graph(lambda: [hand(x, dd, w, 1e-6, warps) for x, dd in zip(xs, ds)]) / layers
            row[f"hand_w{warps}_total_equal"] = all(torch.equal(g[0], e[0]) for g, e in zip(got, want))
            row[f"hand_w{warps}_norm_maxdiff"] = max((g[1].float() - e[1].float()).abs().max().item() for g, e in zip(got, want))
        print(json.dumps(row), flush=True)
        rows.append(row)
json.dump(rows, open(sys.argv[1], "w"), indent=1)
