"""A DFlash drafter's projections at Qwen3-8B's shapes, few rows: bf16 (cuBLAS, a Triton kernel) against fp8
weights (e4m3, one scale per output row) through a Triton kernel that widens them to bf16 in registers
(activations stay bf16) and through torch._scaled_mm (activations quantised per row, then an fp8 x fp8
product). Cold: one CUDA graph of products over enough weight copies to exceed L2 (as a round's drafter layers).
python3 fp8_linear_ab.py OUT.json"""
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

FP8 = torch.float8_e4m3fn


@triton.jit
def _skinny(X, W, S, Y, M, N, K, sxm, swn, sym, HAS_SCALE: tl.constexpr, BLOCK_N: tl.constexpr,
            BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr):
    # Y^T = W X^T: BLOCK_N weight rows per program against all of X's rows; W bf16 or fp8 (then widened).
    n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    m = tl.arange(0, BLOCK_M)
    k = tl.arange(0, BLOCK_K)
    acc = tl.zeros([BLOCK_N, BLOCK_M], tl.float32)
    for k0 in range(0, K, BLOCK_K):
        w = tl.load(W + n[:, None] * swn + (k0 + k)[None, :]).to(tl.bfloat16)
        x = tl.load(X + m[None, :] * sxm + (k0 + k)[:, None], mask=(m < M)[None, :], other=0.0)
        acc = tl.dot(w, x, acc)
    if HAS_SCALE:
        acc = acc * tl.load(S + n)[:, None]
    tl.store(Y + m[None, :] * sym + n[:, None], acc.to(Y.dtype.element_ty), mask=(m < M)[None, :])


def skinny(x, w, scale, block_n, block_k, warps, stages):
    m, k = x.shape
    n = w.shape[0]
    y = torch.empty(m, n, dtype=x.dtype, device=x.device)
    _skinny[(triton.cdiv(n, block_n),)](x, w, scale if scale is not None else w, y, m, n, k, x.stride(0),
                                       w.stride(0), y.stride(0), HAS_SCALE=scale is not None, BLOCK_N=block_n,
                                       BLOCK_M=max(16, triton.next_power_of_2(m)), BLOCK_K=block_k,
                                       num_warps=warps, num_stages=stages)
    return y


def quantize_rows(w):
    scale = w.abs().amax(-1, keepdim=True).float().clamp(min=1e-12) / 448.0
    return (w.float() / scale).to(FP8), scale


def quant_act(x):
    scale = x.abs().amax(-1, keepdim=True).float().clamp(min=1e-12) / 448.0
    return (x.float() / scale).to(FP8), scale


quant_act_compiled = torch.compile(quant_act, dynamic=False)


def scaled(x, wq, ws_row, quant):
    m = x.shape[0]
    pad = -m % 16
    if pad:
        x = F.pad(x, (0, 0, 0, pad))
    xq, xs = quant(x)
    y = torch._scaled_mm(xq, wq.t(), scale_a=xs, scale_b=ws_row, out_dtype=torch.bfloat16)
    return y[:m] if pad else y


def main():
    dev, dtype = "cuda", torch.bfloat16
    shapes = {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (24576, 4096), "down": (4096, 12288),
              "fc": (4096, 20480), "head32k": (32768, 4096), "head": (151936, 4096)}
    rows_of = {"head32k": (15, 16), "head": (15,)}
    configs = [(32, 256, 4, 4), (64, 128, 4, 4), (64, 256, 4, 3), (128, 128, 4, 3), (128, 256, 8, 3)]
    out = []
    started = time.time()
    for name, (n, k) in shapes.items():
        copies = max(2, -(-400_000_000 // (n * k * 2)))
        ws = [torch.randn(n, k, device=dev, dtype=dtype) * 0.02 for _ in range(copies)]
        q = [quantize_rows(w) for w in ws]
        for m in rows_of.get(name, (16, 128)):
            x = torch.randn(m, k, device=dev, dtype=dtype)
            ref = F.linear(x, ws[0]).float()
            points = [("cublas bf16", lambda w, i: F.linear(x, w))]
            points += [(f"triton bf16 {c}", lambda w, i, c=c: skinny(x, w, None, *c)) for c in configs]
            points += [(f"triton fp8w {c}", lambda w, i, c=c: skinny(x, q[i][0], q[i][1].view(-1), *c))
                       for c in configs]
            points += [("scaled_mm eager-quant", lambda w, i: scaled(x, q[i][0], q[i][1].view(1, -1), quant_act)),
                       ("scaled_mm compiled-quant",
                        lambda w, i: scaled(x, q[i][0], q[i][1].view(1, -1), quant_act_compiled))]
            for label, fn in points:
                def run():
                    return [fn(w, i) for i, w in enumerate(ws)]
                try:
                    y = run()[0].float()
                    err = ((y - ref).norm() / ref.norm()).item()
                    us = time_graph(run, reps=20)[0]
                except Exception as e:
                    print("FAIL", name, m, label, repr(e)[:300], flush=True)
                    continue
                per = us / copies
                out.append({"shape": name, "n": n, "k": k, "rows": m, "how": label, "us": per,
                            "bf16_tb_s": n * k * 2 / (per * 1e-6) / 1e12, "rel_err": err})
                print(f"{name:8s} M={m:3d} {label:36s} {per:7.1f} us  (bf16-bytes {out[-1]['bf16_tb_s']:5.2f} TB/s)"
                      f"  rel err {err:.2g}", flush=True)
        ws.clear(), q.clear()  # (the call ran `del ws, q`: the same, freeing the copies)
        torch.cuda.empty_cache()
        json.dump(out, open(sys.argv[1], "w"), indent=1)
    print(f"{time.time() - started:.0f} s")


if __name__ == "__main__":
    main()
