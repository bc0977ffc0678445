"""The sampler's counter-based uniforms as one Triton kernel (CUDA).

`sampling.draw_uniforms` maps (seed, position) through a Feistel network of MurmurHash3 finalisers in
int64 arithmetic (five finalisers):
written as PyTorch ops that is ~110 elementwise kernels over a handful of values, about a tenth of a
SmolLM2 sampling step's GPU time on the H200 (a kernel costs ~1 us inside a CUDA graph, however small).
This is the same arithmetic, op for op in int64, in one launch, so every uniform is bit for bit the
PyTorch one (tests/test_hash_uniforms.py): a seeded request gets the same uniforms on the CPU and on CUDA
(its tokens then part only where the devices' logits round differently). The CPU keeps the PyTorch path.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from treeflash.sampling import _ROUND_SALTS

_BLOCK = 128  # draws a program takes (a tree's nodes, or several slots' single draws)


@triton.jit
def _mul32(x, lo, hi, mask32):
    # (x * c) mod 2^32 for x in [0, 2^32) and c = hi << 16 | lo, exact in int64 (sampling._mul32).
    return (x * lo + (((x * hi) & 0xFFFF) << 16)) & mask32


@triton.jit
def _fmix32(h, mask32):
    # MurmurHash3's finaliser (sampling._fmix32).
    h = h ^ (h >> 16)
    h = _mul32(h, 0xCA6B, 0x85EB, mask32)
    h = h ^ (h >> 13)
    h = _mul32(h, 0xAE35, 0xC2B2, mask32)
    return h ^ (h >> 16)


@triton.jit
def _uniforms(Seed, Positions, Out, n, seed_stride, pos_stride, mask32, golden, salt0, salt1, salt2, salt3,
              BLOCK: tl.constexpr):
    # The 32-bit constants above 2^31 arrive as int64 arguments (a literal that large would be uint32).
    row = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = cols < n
    left = tl.load(Seed + row * seed_stride).to(tl.int64)
    right = tl.load(Seed + row * seed_stride + 1).to(tl.int64)
    p = tl.load(Positions + row * pos_stride + cols, mask=ok, other=0).to(tl.int64)
    key = _fmix32((p & mask32) ^ golden, mask32)
    # The four rounds of sampling.draw_uniforms's Feistel network, unrolled.
    left, right = right, left ^ _fmix32(right ^ key ^ salt0, mask32)
    left, right = right, left ^ _fmix32(right ^ key ^ salt1, mask32)
    left, right = right, left ^ _fmix32(right ^ key ^ salt2, mask32)
    left, right = right, left ^ _fmix32(right ^ key ^ salt3, mask32)
    k = (left << 20) | (right >> 12)  # the top 52 of the block's 64 bits
    tl.store(Out + row * n + cols, ((k << 1) | 1).to(tl.float64) * 1.1102230246251565e-16, mask=ok)  # 2^-53


def hash_uniforms(seed: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """seed [S, 2] int64 (low, high 32 bits), positions [S, N] integer -> [S, N] float64, as
    `sampling.draw_uniforms` computes them."""
    slots, n = positions.shape
    if seed.stride(-1) != 1:
        seed = seed.contiguous()
    if positions.stride(-1) != 1:
        positions = positions.contiguous()
    out = torch.empty(slots, n, dtype=torch.float64, device=positions.device)
    _uniforms[(slots, triton.cdiv(n, _BLOCK))](seed, positions, out, n, seed.stride(0), positions.stride(0),
                                               0xFFFFFFFF, 0x9E3779B9, *_ROUND_SALTS, BLOCK=_BLOCK)
    return out
