"""A few tokens' mixture-of-experts MLP as three Triton kernels (CUDA): matrix-vector products that read each
(token, chosen expert) pair's weights straight from the layer's stacked ones.

`SparseMoE`'s "gemv" plan (treeflash/models/layers.py). A one-token step of Qwen3-30B-A3B's shape reads 8
experts' 75 MB a layer, 25 us at an H100's measured copy bandwidth, where the grouped product took 115 us and
the gathered plan (each pair's weights copied, then multiplied) 119 (benchmarks/gpu-moe/): a dozen small
launches and a copy of the weights it reads. Here (61 us, benchmarks/gpu-moe-gemv/):

1. `_gate_up`: one program per (pair, block of BLOCK_J expert-MLP columns) multiplies the token's row by its
   expert's gate and up rows, in float32, and writes silu(gate) * up in the activations' dtype (GPT-OSS: its
   biases added and its clamped SwiGLU instead);
2. `_down`: one program per (pair, block of BLOCK_I output features), the pair's activations through its
   expert's down projection (plus its bias), in float32;
3. `_combine`: each token's k pair outputs summed in order, weighted by the router's weights, in float32, and
   rounded once to the output's dtype.

No program reads another token's values and the k pairs are summed in one fixed order, so a token's output
has the same bits whatever tokens share the forward (as on the CPU). Reading a pair's expert once
per pair, it suits few pairs: with many, every expert some token chose is read once by the grouped or dense
plan instead (`SparseMoE.plan`). Imported lazily (CUDA); under TRITON_INTERPRET=1 it runs on CPU tensors
(tests/test_moe_kernel.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl


@dataclass(frozen=True)
class Launch:
    block_j: int = 8  # expert-MLP columns a `_gate_up` program writes
    block_h: int = 1024  # hidden features per step of its loop
    block_i: int = 16  # output features a `_down` program writes
    block_k: int = 256  # expert-MLP columns per step of its loop
    num_warps: int = 4


DEFAULT_LAUNCH = Launch()
COMBINE_BLOCK = 1024  # output features a `_combine` program sums


@triton.jit
def _gate_up(X, W, Bias, Experts, Act, hidden, width, per_token, sx, sw_e, sw_r, sb_e, sa,
             BLOCK_J: tl.constexpr, BLOCK_H: tl.constexpr, HAS_BIAS: tl.constexpr, LIMIT: tl.constexpr):
    pair = tl.program_id(0)
    j = tl.program_id(1) * BLOCK_J + tl.arange(0, BLOCK_J)
    j_ok = j < width
    expert = tl.load(Experts + pair).to(tl.int64)
    x_row = X + (pair // per_token).to(tl.int64) * sx
    gate_rows = W + expert * sw_e + j[:, None].to(tl.int64) * sw_r
    up_rows = gate_rows + width * sw_r  # [gate; up] stacked along the rows
    gate = tl.zeros([BLOCK_J], tl.float32)
    up = tl.zeros([BLOCK_J], tl.float32)
    for h0 in range(0, hidden, BLOCK_H):
        h = h0 + tl.arange(0, BLOCK_H)
        h_ok = h < hidden
        x = tl.load(x_row + h, mask=h_ok, other=0.0).to(tl.float32)
        ok = j_ok[:, None] & h_ok[None, :]
        gate += tl.sum(tl.load(gate_rows + h[None, :], mask=ok, other=0.0).to(tl.float32) * x[None, :], 1)
        up += tl.sum(tl.load(up_rows + h[None, :], mask=ok, other=0.0).to(tl.float32) * x[None, :], 1)
    if HAS_BIAS:
        gate += tl.load(Bias + expert * sb_e + j, mask=j_ok, other=0.0).to(tl.float32)
        up += tl.load(Bias + expert * sb_e + width + j, mask=j_ok, other=0.0).to(tl.float32)
    if LIMIT > 0:  # GPT-OSS's clamped SwiGLU (models/layers.py: SparseMoE.activation)
        gate = tl.minimum(gate, LIMIT)
        up = tl.minimum(tl.maximum(up, -LIMIT), LIMIT)
        act = (up + 1.0) * gate / (1.0 + tl.exp(-1.702 * gate))
    else:
        act = gate / (1.0 + tl.exp(-gate)) * up
    tl.store(Act + pair.to(tl.int64) * sa + j, act.to(Act.dtype.element_ty), mask=j_ok)


@triton.jit
def _down(Act, W, Bias, Experts, Pairs, hidden, width, sa, sw_e, sw_r, sb_e, sp,
          BLOCK_I: tl.constexpr, BLOCK_K: tl.constexpr, HAS_BIAS: tl.constexpr):
    pair = tl.program_id(0)
    i = tl.program_id(1) * BLOCK_I + tl.arange(0, BLOCK_I)
    i_ok = i < hidden
    expert = tl.load(Experts + pair).to(tl.int64)
    rows = W + expert * sw_e + i[:, None].to(tl.int64) * sw_r
    act_row = Act + pair.to(tl.int64) * sa
    acc = tl.zeros([BLOCK_I], tl.float32)
    for k0 in range(0, width, BLOCK_K):
        k = k0 + tl.arange(0, BLOCK_K)
        k_ok = k < width
        a = tl.load(act_row + k, mask=k_ok, other=0.0).to(tl.float32)
        w = tl.load(rows + k[None, :], mask=i_ok[:, None] & k_ok[None, :], other=0.0).to(tl.float32)
        acc += tl.sum(w * a[None, :], 1)
    if HAS_BIAS:
        acc += tl.load(Bias + expert * sb_e + i, mask=i_ok, other=0.0).to(tl.float32)
    tl.store(Pairs + pair.to(tl.int64) * sp + i, acc, mask=i_ok)


@triton.jit
def _combine(Pairs, Weights, Out, hidden, per_token, sp, so, BLOCK: tl.constexpr):
    token = tl.program_id(0)
    i = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    i_ok = i < hidden
    out = tl.zeros([BLOCK], tl.float32)
    for c in range(0, per_token):  # the k pairs in one fixed order
        pair = (token * per_token + c).to(tl.int64)
        out += tl.load(Weights + pair).to(tl.float32) * tl.load(Pairs + pair * sp + i, mask=i_ok, other=0.0)
    tl.store(Out + token.to(tl.int64) * so + i, out.to(Out.dtype.element_ty), mask=i_ok)


def expert_mlp(x: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor, weights: torch.Tensor,
               chosen: torch.Tensor, launch: Launch = DEFAULT_LAUNCH,
               biases: tuple[torch.Tensor, torch.Tensor] | None = None, limit: float | None = None) -> torch.Tensor:
    """x [N, H]; gate_up [E, 2I, H] (gate rows then up rows) and down [E, H, I], each expert's rows contiguous;
    weights, chosen [N, k]: each token's router weights and experts. Returns [N, H] in x's dtype:
    sum over c of weights[n, c] * down[e] @ (silu(gate[e] @ x[n]) * (up[e] @ x[n])), e = chosen[n, c].
    biases: [E, 2I] and [E, H], added to each product; limit: GPT-OSS's clamped SwiGLU in place of silu * up."""
    n, hidden = x.shape
    per_token = chosen.shape[1]
    width = down.shape[2]
    if x.stride(1) != 1 or gate_up.stride(2) != 1 or down.stride(2) != 1:
        raise ValueError("expert_mlp needs the feature dimension contiguous")
    experts = chosen.reshape(-1).contiguous()
    gate_up_bias, down_bias = biases if biases is not None else (gate_up, down)  # (unused without biases)
    if biases is not None and (gate_up_bias.stride(1) != 1 or down_bias.stride(1) != 1):
        raise ValueError("expert_mlp needs each expert's biases contiguous")
    act = torch.empty(n * per_token, width, dtype=x.dtype, device=x.device)
    _gate_up[(n * per_token, triton.cdiv(width, launch.block_j))](
        x, gate_up, gate_up_bias, experts, act, hidden, width, per_token, x.stride(0), gate_up.stride(0),
        gate_up.stride(1), gate_up_bias.stride(0), act.stride(0), BLOCK_J=launch.block_j, BLOCK_H=launch.block_h,
        HAS_BIAS=biases is not None, LIMIT=float(limit or 0.0), num_warps=launch.num_warps)
    pairs = torch.empty(n * per_token, hidden, dtype=torch.float32, device=x.device)
    _down[(n * per_token, triton.cdiv(hidden, launch.block_i))](
        act, down, down_bias, experts, pairs, hidden, width, act.stride(0), down.stride(0), down.stride(1),
        down_bias.stride(0), pairs.stride(0), BLOCK_I=launch.block_i, BLOCK_K=launch.block_k,
        HAS_BIAS=biases is not None, num_warps=launch.num_warps)
    out = torch.empty(n, hidden, dtype=x.dtype, device=x.device)
    _combine[(n, triton.cdiv(hidden, COMBINE_BLOCK))](
        pairs, weights.reshape(-1).contiguous(), out, hidden, per_token, pairs.stride(0), out.stride(0),
        BLOCK=COMBINE_BLOCK)
    return out
