"""Y = X @ W^T for few rows (X [M, K], W [N, K], bf16), weights as the MMA's wide side (Y^T = W X^T): each
program takes BLOCK_N weight rows and all of X's rows (BLOCK_M >= M), so W is read once. Cold timings
over 36 weight copies (as 36 layers) against F.linear (cuBLAS) at Qwen3-8B's projection shapes.
python3 skinny.py OUT.json"""
import json
import os
import sys
import time

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from tree_kernel_ab import time_graph  # noqa: E402  (CUDA-graph replays, the median of five batches)

CUDA = torch.cuda.is_available()


@triton.jit
def _skinny(X, W, Y, M, N, K, sxm, swn, sym, BLOCK_N: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr):
    n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    m = tl.arange(0, BLOCK_M)
    k = tl.arange(0, BLOCK_K)
    acc = tl.zeros([BLOCK_N, BLOCK_M], tl.float32)
    for k0 in range(0, K, BLOCK_K):
        w = tl.load(W + n[:, None] * swn + (k0 + k)[None, :])
        x = tl.load(X + m[None, :] * sxm + (k0 + k)[:, None], mask=(m < M)[None, :], other=0.0)
        acc = tl.dot(w, x, acc)
    tl.store(Y + m[None, :] * sym + n[:, None], acc.to(Y.dtype.element_ty), mask=(m < M)[None, :])


def skinny(x, w, block_n, block_k, warps, stages):
    m, k = x.shape
    n = w.shape[0]
    y = torch.empty(m, n, dtype=x.dtype, device=x.device)
    block_m = max(16, triton.next_power_of_2(m))
    _skinny[(triton.cdiv(n, block_n),)](x, w, y, m, n, k, x.stride(0), w.stride(0), y.stride(0),
                                       BLOCK_N=block_n, BLOCK_M=block_m, BLOCK_K=block_k, num_warps=warps,
                                       num_stages=stages)
    return y


def main():
    dev = "cuda" if CUDA else "cpu"
    dtype = torch.bfloat16 if CUDA else torch.float32
    shapes = {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (24576, 4096), "down": (4096, 12288)} if CUDA \
        else {"tiny": (64, 256)}
    layers = 36 if CUDA else 2
    rows = (1, 16, 65) if CUDA else (1, 5)
    configs = [(32, 128, 4, 4), (64, 128, 4, 4), (128, 128, 4, 3), (64, 256, 4, 3)] if CUDA else [(16, 64, 4, 1)]
    out = []
    started = time.time()
    for name, (n, k) in shapes.items():
        ws = [torch.randn(n, k, device=dev, dtype=dtype) * 0.02 for _ in range(layers)]
        gb = n * k * ws[0].element_size() * layers / 1e9
        for m in rows:
            x = torch.randn(m, k, device=dev, dtype=dtype)
            ref = F.linear(x, ws[0]).float()
            points = [("cublas", None)] + [(f"skinny {c}", c) for c in configs]
            for label, c in points:
                def run():
                    return [F.linear(x, w) if c is None else skinny(x, w, *c) for w in ws]
                try:
                    err = (run()[0].float() - ref).abs().max().item()
                    us = time_graph(run, reps=20)[0] if CUDA else 0.0
                except Exception as e:
                    print("FAIL", name, m, label, repr(e)[:200], flush=True)
                    continue
                tbps = gb / (us * 1e-6) / 1e3 if us else 0.0
                out.append({"shape": name, "rows": m, "how": label, "us_36": us, "tb_s": tbps, "err": err})
                print(f"{name:8s} M={m:3d} {label:28s} {us:8.1f} us / 36  {tbps:5.2f} TB/s  err {err:.2g}", flush=True)
        ws.clear()  # (the call ran `del ws`: the same, freeing the copies)
        json.dump(out, open(sys.argv[1], "w"), indent=1)
    print(f"{time.time() - started:.0f} s")


if __name__ == "__main__":
    main()
