"""float32 products on the CPU: F.linear (MKL's sgemm) against oneDNN's with prepacked weights
(`treeflash.models.kernels.prepack_cpu` / `linear`), over a SmolLM2-135M-sized stack of projections (30 layers x
q/k/v 576->960, o 576->576, gate/up 576->3072, down 1536->576; 425 MB, far past the caches) at 1, 9 and 17 rows;
and whether each row's result is the same whatever the rows beside it (1, 2, 5, 9, 16, 17 rows). argv[1]: JSON.
"""
import json
import statistics
import sys
import time

import torch
import torch.nn.functional as F

from treeflash.models.kernels import linear, prepack_cpu

torch.set_num_threads(int(sys.argv[2]) if len(sys.argv) > 2 else 2)
torch.manual_seed(0)
shapes = [(960, 576), (576, 576), (3072, 576), (576, 1536)] * 30
weights = [torch.randn(n, k) * 0.02 for n, k in shapes]
plain = [w.clone() for w in weights]
assert prepack_cpu(weights)


def stack(ws, xs, fn):
    with torch.inference_mode():
        for w, x in zip(ws, xs):
            fn(x, w)


def timed(ws, xs, fn, reps=5):
    stack(ws, xs, fn)
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        stack(ws, xs, fn)
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


out = {"threads": torch.get_num_threads(), "torch": torch.__version__, "timing_ms": {}, "row_invariant": {}}
for rows in (1, 9, 17):
    xs = [torch.randn(rows, k) for _, k in shapes]
    mkl, dnn = [], []
    for _ in range(3):  # interleaved
        mkl.append(timed(plain, xs, F.linear))
        dnn.append(timed(weights, xs, linear))
    out["timing_ms"][rows] = {"mkl": statistics.median(mkl), "onednn_prepacked": statistics.median(dnn)}
    print(f"{rows} rows: MKL {statistics.median(mkl):.1f} ms, oneDNN prepacked {statistics.median(dnn):.1f} ms",
          flush=True)
for (n, k), w, p in list(zip(shapes, weights, plain))[:4]:
    x = torch.randn(17, k)
    with torch.inference_mode():
        same = {}
        for name, fn, ww in (("mkl", F.linear, p), ("onednn_prepacked", linear, w)):
            first = fn(x[:1], ww)[0]
            same[name] = {m: float((fn(x[:m], ww)[0] - first).abs().max()) for m in (2, 5, 9, 16, 17)}
    out["row_invariant"][f"{n}x{k}"] = same
    print(f"{n}x{k}: row 0's largest change from 1 row to more, MKL {max(same['mkl'].values()):.2g}, "
          f"oneDNN {max(same['onednn_prepacked'].values()):.2g}", flush=True)
json.dump(out, open(sys.argv[1], "w"), indent=1)
