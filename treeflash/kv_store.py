"""New keys and values into a layer's cache rows in one Triton launch (CUDA), for `KVCache.write`.

PyTorch's way is two `scatter_` kernels a layer (keys, values), each computing a 4-d offset per element:
on an H200 at the Qwen3-8B shape the AR step's 72 of them took 262 us of its 5.09 ms of kernels
(benchmarks/h200-topk-kernel/prof-qwen3-8b.txt, FlexAttention's path; the splitkv kernels store the rows
themselves). Here one program per (slot x KV head, block of new tokens) copies both. Imported lazily
(CUDA only); under TRITON_INTERPRET=1 the kernel runs on CPU tensors (tests).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _store_rows(K, V, NewK, NewV, Rows, sk_b, sk_h, sk_n, sv_b, sv_h, sv_n, snk_b, snk_h, snk_t,
                snv_b, snv_h, snv_t, sr_b, sr_t, KV_HEADS, T, BLOCK_T: tl.constexpr, HEAD_DIM: tl.constexpr):
    b = tl.program_id(0) // KV_HEADS
    h = tl.program_id(0) % KV_HEADS
    t = tl.program_id(1) * BLOCK_T + tl.arange(0, BLOCK_T)
    ok = (t < T)[:, None]
    d = tl.arange(0, HEAD_DIM)[None, :]
    rows = tl.load(Rows + b * sr_b + t * sr_t, mask=t < T, other=0)[:, None]
    tl.store(K + b * sk_b + h * sk_h + rows * sk_n + d,
             tl.load(NewK + b * snk_b + h * snk_h + t[:, None] * snk_t + d, mask=ok), mask=ok)
    tl.store(V + b * sv_b + h * sv_h + rows * sv_n + d,
             tl.load(NewV + b * snv_b + h * snv_h + t[:, None] * snv_t + d, mask=ok), mask=ok)


def fits(k: torch.Tensor, v: torch.Tensor, keys: torch.Tensor, values: torch.Tensor) -> bool:
    """The kernel tiles the head dimension whole (a power of two) and needs it contiguous everywhere."""
    head_dim = k.shape[-1]
    return not head_dim & (head_dim - 1) and all(x.stride(-1) == 1 for x in (k, v, keys, values))


def store_rows(keys: torch.Tensor, values: torch.Tensor, k: torch.Tensor, v: torch.Tensor, rows: torch.Tensor) -> None:
    """keys, values: [B, Hkv, L, D] a layer's cache; k, v: [B, Hkv, T, D] the new tokens' (any strides with
    D contiguous); rows: [B, T] the cache row of each. What two `scatter_` calls along the rows do."""
    batch, kv_heads, t, head_dim = k.shape
    block_t = min(32, max(2, triton.next_power_of_2(t)))
    _store_rows[(batch * kv_heads, triton.cdiv(t, block_t))](
        keys, values, k, v, rows, keys.stride(0), keys.stride(1), keys.stride(2), values.stride(0),
        values.stride(1), values.stride(2), k.stride(0), k.stride(1), k.stride(2), v.stride(0), v.stride(1),
        v.stride(2), rows.stride(0), rows.stride(1), kv_heads, t, BLOCK_T=block_t, HEAD_DIM=head_dim, num_warps=4)
