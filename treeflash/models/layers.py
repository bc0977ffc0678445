"""Building blocks shared by the target decoder and the DFlash drafter."""

from __future__ import annotations

import math

import torch
from torch import nn

from treeflash.config import RopeConfig
from treeflash.models.kernels import (EAGER, Kernels, Linear, apply_rotary,  # noqa: F401  (apply_rotary: re-exported)
                                      linear)


class RMSNorm(nn.Module):
    kernels: Kernels = EAGER  # the pieces the forward calls (models/kernels.py: use_fast_path)

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.kernels.rms_norm(x, self.weight, self.eps)

    def add(self, x: torch.Tensor, delta: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """The residual sum x + delta and its norm, made by one kernel compiled (delta None: x and its norm)."""
        if delta is None:
            return x, self(x)
        return self.kernels.add_rms_norm(x, delta, self.weight, self.eps)


class MLP(nn.Module):
    kernels: Kernels = EAGER
    gate_up: tuple[torch.Tensor, torch.Tensor | None] | None = None  # fused weight, bias (models/kernels.py)
    use_fused: bool = False

    def __init__(self, hidden: int, intermediate: int, bias: bool = False):
        super().__init__()
        self.gate_proj = Linear(hidden, intermediate, bias=bias)
        self.up_proj = Linear(hidden, intermediate, bias=bias)
        self.down_proj = Linear(intermediate, hidden, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.use_fused and not torch.is_grad_enabled():  # fused weights carry no gradient
            gate, up = linear(x, *self.gate_up).chunk(2, dim=-1)  # one GEMM, gate then up
        else:
            gate, up = self.gate_proj(x), self.up_proj(x)
        return self.down_proj(self.kernels.silu_mul(gate, up))


def rope_inv_freq(rope: RopeConfig, head_dim: int) -> torch.Tensor:
    """Per-frequency inverse wavelengths, with linear or Llama-3 scaling applied."""
    inv_freq = 1.0 / (rope.theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64, device="cpu").float() / head_dim))
    if rope.kind == "linear":
        return inv_freq / rope.factor
    if rope.kind == "llama3":
        # Llama 3.1: long wavelengths are divided by `factor`, short ones kept, the band between interpolated.
        old_len = rope.original_max_position_embeddings
        low_wavelen = old_len / rope.low_freq_factor
        high_wavelen = old_len / rope.high_freq_factor
        wavelen = 2 * math.pi / inv_freq
        scaled = torch.where(wavelen > low_wavelen, inv_freq / rope.factor, inv_freq)
        smooth = (old_len / wavelen - rope.low_freq_factor) / (rope.high_freq_factor - rope.low_freq_factor)
        smoothed = (1 - smooth) * scaled / rope.factor + smooth * scaled
        medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
        return torch.where(medium, smoothed, scaled)
    return inv_freq


class Rotary(nn.Module):
    """Rotary embedding for arbitrary per-token positions (tree nodes share positions with siblings)."""

    kernels: Kernels = EAGER

    def __init__(self, rope: RopeConfig, head_dim: int):
        super().__init__()
        self.register_buffer("inv_freq", rope_inv_freq(rope, head_dim), persistent=False)

    def forward(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        # positions: [B, T] -> cos, sin: [B, T, head_dim]
        return self.kernels.rotary_tables(positions, self.inv_freq, dtype)
