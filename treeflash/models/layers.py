"""Building blocks shared by the target decoder and the DFlash drafter."""

from __future__ import annotations

import dataclasses
import importlib.util
import math

import torch
import torch.nn.functional as F
from torch import nn

from treeflash.config import ExpertsConfig, RopeConfig
from treeflash.models.kernels import (EAGER, Kernels, Linear, apply_rotary,  # noqa: F401  (apply_rotary: re-exported)
                                      linear)


class RMSNorm(nn.Module):
    kernels: Kernels = EAGER  # the pieces the forward calls (models/kernels.py: use_fast_path)

    def __init__(self, dim: int, eps: float, offset: bool = False):
        super().__init__()
        # offset (Gemma): the checkpoint's weight w scales by 1 + w, in float32 before the cast back
        self.weight = nn.Parameter(torch.zeros(dim) if offset else torch.ones(dim))
        self.eps = eps
        self.offset = offset

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.kernels.rms_norm(x, self.weight, self.eps, self.offset)

    def add(self, x: torch.Tensor, delta: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """The residual sum x + delta and its norm, made by one kernel compiled (delta None: x and its norm)."""
        if delta is None:
            return x, self(x)
        return self.kernels.add_rms_norm(x, delta, self.weight, self.eps, self.offset)


class MLP(nn.Module):
    kernels: Kernels = EAGER
    gate_up: tuple[torch.Tensor, torch.Tensor | None] | None = None  # fused weight, bias (models/kernels.py)
    use_fused: bool = False

    def __init__(self, hidden: int, intermediate: int, bias: bool = False, activation: str = "silu"):
        super().__init__()
        self.gate_proj = Linear(hidden, intermediate, bias=bias)
        self.up_proj = Linear(hidden, intermediate, bias=bias)
        self.down_proj = Linear(intermediate, hidden, bias=bias)
        self.activation = activation  # the gate's: "silu", or Gemma's "gelu_tanh"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.use_fused and not torch.is_grad_enabled():  # fused weights carry no gradient
            gate, up = linear(x, *self.gate_up).chunk(2, dim=-1)  # one GEMM, gate then up
        else:
            gate, up = self.gate_proj(x), self.up_proj(x)
        return self.down_proj(self.kernels.silu_mul(gate, up, self.activation))


class Expert(nn.Module):
    """One expert's projections, by the checkpoints' names. Plain `nn.Linear`s: their weights become views of
    the layer's stacked ones (`SparseMoE.stack_experts`), and are neither fused nor prepacked one by one."""

    def __init__(self, hidden: int, intermediate: int, bias: bool = False):
        super().__init__()
        self.gate_proj = nn.Linear(hidden, intermediate, bias=bias)
        self.up_proj = nn.Linear(hidden, intermediate, bias=bias)
        self.down_proj = nn.Linear(intermediate, hidden, bias=bias)


# On the CPU, experts of at least this many weights per projection (width x hidden) take the looped plan, smaller
# ones the gathered plan (`SparseMoE.plan`): measured in benchmarks/cpu-moe-looped.
LOOPED_MIN_WEIGHTS = 1 << 17


class SparseMoE(nn.Module):
    """A mixture-of-experts MLP (Qwen3-MoE, Qwen2-MoE, Mixtral, GPT-OSS): the router's softmax over the experts
    picks each token's top k, and the token's output is their MLP outputs weighted by those probabilities
    (rescaled to sum to 1 where the config says), plus, for Qwen2-MoE, a shared MLP scaled by a sigmoid gate.
    GPT-OSS's router and projections carry biases and its experts a clamped SwiGLU (`activation`).

    The experts' weights are stacked, [E, 2I, H] (gate then up) and [E, H, I], and a forward computes with fixed
    shapes, no host synchronisation (CUDA graphs capture it; the CPU's looped plan excepted), by one of five
    plans (`plan`):
    - gemv: on CUDA for few (token, chosen expert) pairs (N k <= E / 4, where whole rounds measured it faster
      than the grouped product: benchmarks/gpu-moe-gemv): Triton kernels multiply each pair's row by its
      expert's weights read in place (treeflash/moe_kernel.py), a one-token step reading only its k experts,
      once; each token's result independent of the others';
    - grouped: the pairs sorted by expert and multiplied by PyTorch's grouped product (`torch._grouped_mm`),
      which reads each chosen expert's weights once however many tokens chose it. CUDA in bfloat16, where
      that product runs (probed at `stack_experts`: Hopper GPUs; in float32 PyTorch 2.11's reads its group
      ends on the host, which a graph's capture refuses);
    - looped: the CPU's for experts of at least LOOPED_MIN_WEIGHTS weights a projection: a host loop over the
      pairs, each pair's products reading its expert's weights in place (`torch.mv`), no copy;
    - gathered: each pair's weights gathered and multiplied as a batch of matrix-vector products, in groups of
      at most E pairs (the memory of one layer's experts): the CPU's for smaller experts, whose copies cost
      less than a loop's steps, and CUDA's without the grouped product from the gemv plan's bound (from one
      pair where Triton is missing) up to 3 N k <= E.
      On the CPU either plan gives each token's result the same bits whatever tokens share the forward, as
      the CPU's other products do (docs/exactness.md);
    - dense: every expert over every token as two batched products, and the weighted sum over experts, the
      unchosen ones weighing zero: every expert's weights read once (CUDA without the grouped product, more
      pairs).
    """

    def __init__(self, hidden: int, experts: ExpertsConfig):
        super().__init__()
        self.config = experts
        self.gate = Linear(hidden, experts.count, bias=experts.bias)
        self.experts = nn.ModuleList(Expert(hidden, experts.intermediate_size, experts.bias)
                                     for _ in range(experts.count))
        if experts.shared_intermediate_size:
            self.shared_expert = MLP(hidden, experts.shared_intermediate_size)
            self.shared_expert_gate = Linear(hidden, 1, bias=False)
        else:
            self.shared_expert = self.shared_expert_gate = None
        self.stacked: tuple[torch.Tensor, torch.Tensor] | None = None
        self.biases: tuple[torch.Tensor, torch.Tensor] | None = None  # [E, 2I] and [E, H], stacked alike
        self.grouped = False  # whether the grouped product runs here (`stack_experts` probes it)
        self.gemv = False  # whether the Triton kernels run here (CUDA)

    def stack_experts(self) -> None:
        """Lay the experts' weights out as two stacked tensors and make each expert's parameters views of them
        (names, shapes and values stay the checkpoint's; nothing is held twice); probe the grouped product.
        Idempotent."""
        if self.stacked is not None:
            return
        width = self.config.intermediate_size
        with torch.no_grad():
            gate_up = torch.stack([torch.cat([e.gate_proj.weight, e.up_proj.weight]) for e in self.experts])
            down = torch.stack([e.down_proj.weight for e in self.experts])
            if self.config.bias:
                self.biases = (torch.stack([torch.cat([e.gate_proj.bias, e.up_proj.bias]) for e in self.experts]),
                               torch.stack([e.down_proj.bias for e in self.experts]))
        for i, e in enumerate(self.experts):
            for lin, weight in ((e.gate_proj, gate_up[i, :width]), (e.up_proj, gate_up[i, width:]),
                                (e.down_proj, down[i])):
                lin.weight = nn.Parameter(weight, requires_grad=lin.weight.requires_grad)
            if self.biases is not None:
                for lin, bias in ((e.gate_proj, self.biases[0][i, :width]), (e.up_proj, self.biases[0][i, width:]),
                                  (e.down_proj, self.biases[1][i])):
                    lin.bias = nn.Parameter(bias, requires_grad=lin.bias.requires_grad)
        self.stacked = (gate_up, down)
        # (bfloat16 on Hopper only, where it was measured capturable: in float32 PyTorch 2.11's grouped product
        # reads the group ends on the host, which a CUDA graph's capture refuses, and an eager probe cannot
        # tell whether another GPU's path does the same; benchmarks/gpu-moe/)
        self.gemv = gate_up.device.type == "cuda" and importlib.util.find_spec("triton") is not None
        self.grouped = (gate_up.device.type == "cuda" and gate_up.dtype == torch.bfloat16
                        and torch.cuda.get_device_capability(gate_up.device)[0] == 9
                        and _grouped_product_runs(gate_up))

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x [N, H] -> each token's expert weights and experts, [N, k] each (softmax in float32, as HF's)."""
        probs = torch.softmax(self.gate(x).float(), dim=-1)
        weights, chosen = probs.topk(self.config.per_token, dim=-1)
        if self.config.normalize:
            weights = weights / weights.sum(-1, keepdim=True)
        return weights.to(x.dtype), chosen

    def activation(self, gate_up: torch.Tensor) -> torch.Tensor:
        """[..., 2I] gate then up (their biases added) -> [..., I]: silu(gate) * up, or GPT-OSS's clamped SwiGLU."""
        gate, up = gate_up.chunk(2, dim=-1)
        limit = self.config.swiglu_limit
        if limit is None:
            return F.silu(gate) * up
        gate = gate.clamp(max=limit)
        return (up.clamp(-limit, limit) + 1) * gate * torch.sigmoid(gate * 1.702)

    def _biased(self, out: torch.Tensor, which: int, experts: torch.Tensor | int) -> torch.Tensor:
        """out plus the gate_up (which 0) or down (1) biases of the given experts, where there are biases."""
        return out if self.biases is None else out + self.biases[which][experts]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.stack_experts()
        rows = x.reshape(-1, x.shape[-1])
        weights, chosen = self.route(rows)
        out = getattr(self, "_" + self.plan(chosen))(rows, weights, chosen)  # _gemv, _grouped, _looped, ...
        if self.shared_expert is not None:
            out = out + torch.sigmoid(self.shared_expert_gate(rows)) * self.shared_expert(rows)
        return out.view(x.shape)

    def plan(self, chosen: torch.Tensor) -> str:
        """Which plan a forward takes (a shape's, never a value's: the class docstring)."""
        if chosen.device.type == "cpu":
            return "looped" if self.config.intermediate_size * self.gate.weight.shape[1] >= LOOPED_MIN_WEIGHTS \
                else "gathered"
        if self.gemv and 4 * chosen.numel() <= self.config.count:
            return "gemv"
        if self.grouped:
            return "grouped"
        return "gathered" if 3 * chosen.numel() <= self.config.count else "dense"

    def _grouped(self, x: torch.Tensor, weights: torch.Tensor, chosen: torch.Tensor) -> torch.Tensor:
        gate_up, down = self.stacked
        n, k = chosen.shape
        experts = chosen.reshape(-1)
        order = experts.argsort(stable=True)  # the pairs, grouped by expert
        every = torch.arange(self.config.count, device=experts.device, dtype=experts.dtype)
        # each expert's group's end (bincount would synchronise: it sizes its output by the largest value)
        sorted_experts = experts[order]
        ends = torch.searchsorted(sorted_experts, every, right=True).to(torch.int32)
        rows = x.repeat_interleave(k, dim=0)[order]
        hidden = self._biased(torch._grouped_mm(rows, gate_up.transpose(1, 2), offs=ends), 0, sorted_experts)
        out = self._biased(torch._grouped_mm(self.activation(hidden), down.transpose(1, 2), offs=ends), 1,
                           sorted_experts)
        pairs = torch.empty_like(out).index_copy_(0, order, out)  # back in (token, expert) order
        return (pairs.view(n, k, -1) * weights[:, :, None]).sum(1)

    def _gemv(self, x: torch.Tensor, weights: torch.Tensor, chosen: torch.Tensor) -> torch.Tensor:
        from treeflash.moe_kernel import expert_mlp  # Triton: imported on CUDA only (and in tests)

        return expert_mlp(x, *self.stacked, weights, chosen, biases=self.biases, limit=self.config.swiglu_limit)

    def _looped(self, x: torch.Tensor, weights: torch.Tensor, chosen: torch.Tensor) -> torch.Tensor:
        gate_up, down = self.stacked
        n, k = chosen.shape
        out = []
        for pair, expert in enumerate(chosen.reshape(-1).tolist()):  # (the CPU: a host loop costs no graph)
            hidden = self._biased(torch.mv(gate_up[expert], x[pair // k]), 0, expert)
            out.append(self._biased(torch.mv(down[expert], self.activation(hidden)), 1, expert))
        return (torch.stack(out).view(n, k, -1) * weights[:, :, None]).sum(1)

    def _gathered(self, x: torch.Tensor, weights: torch.Tensor, chosen: torch.Tensor) -> torch.Tensor:
        gate_up, down = self.stacked
        n, k = chosen.shape
        experts, inputs = chosen.reshape(-1), x.repeat_interleave(k, dim=0)  # one row per (token, expert) pair
        parts = []
        for start in range(0, n * k, self.config.count):
            pick, rows = experts[start:start + self.config.count], inputs[start:start + self.config.count]
            hidden = self._biased(torch.bmm(gate_up[pick], rows[:, :, None]).squeeze(-1), 0, pick)
            parts.append(self._biased(torch.bmm(down[pick], self.activation(hidden)[:, :, None]).squeeze(-1), 1, pick))
        out = torch.cat(parts) if len(parts) > 1 else parts[0]
        return (out.view(n, k, -1) * weights[:, :, None]).sum(1)

    def _dense(self, x: torch.Tensor, weights: torch.Tensor, chosen: torch.Tensor) -> torch.Tensor:
        gate_up, down = self.stacked
        every = torch.zeros(x.shape[0], self.config.count, dtype=x.dtype, device=x.device)
        every.scatter_(1, chosen, weights)  # [N, E]: zero for the experts a token did not choose
        hidden = torch.matmul(gate_up, x.t())  # [E, 2I, N]
        if self.biases is not None:
            hidden = hidden + self.biases[0][:, :, None]
        out = torch.bmm(down, self.activation(hidden.transpose(1, 2)).transpose(1, 2))  # [E, H, N]
        if self.biases is not None:
            out = out + self.biases[1][:, :, None]
        return torch.einsum("ehn,ne->nh", out, every)


def _grouped_product_runs(weight: torch.Tensor) -> bool:
    """Whether torch._grouped_mm multiplies rows by these stacked weights [E, out, in] here (its dtype, device
    and the weights' layout), tried once on a few rows: eight for each of the first two experts, none for the rest."""
    if not hasattr(torch, "_grouped_mm"):
        return False
    try:
        rows = torch.zeros(16, weight.shape[2], dtype=weight.dtype, device=weight.device)
        ends = torch.full((weight.shape[0],), 16, dtype=torch.int32, device=weight.device)
        ends[0] = 8
        torch._grouped_mm(rows, weight.transpose(1, 2), offs=ends)
        return True
    except (RuntimeError, NotImplementedError, TypeError):
        return False


def rope_inv_freq(rope: RopeConfig, head_dim: int) -> torch.Tensor:
    """Per-frequency inverse wavelengths [head_dim / 2], with linear, Llama-3, YaRN or LongRoPE scaling applied.

    With a partial rotation (Phi-4-mini) the rotated dimensions' frequencies come first and the rest are 0,
    which rotates by nothing (cos 1, sin 0, bit for bit): rotate-half over the whole head then pairs dimension
    i with i + head_dim / 2, so the loader moves each head's rotated halves to [0, r/2) and [head_dim/2,
    head_dim/2 + r/2) (checkpoint.py: `_rotated_first`) and the kernels rotate whole heads as for any model."""
    rotated = int(head_dim * rope.partial)
    if rotated != head_dim:
        inv_freq = rope_inv_freq(dataclasses.replace(rope, partial=1.0), rotated)
        return torch.cat([inv_freq, inv_freq.new_zeros((head_dim - rotated) // 2)])
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64, device="cpu").float() / head_dim
    if rope.kind == "longrope":  # (the short factors: config.py limits the context to them)
        return 1.0 / (torch.tensor(rope.short_factor, dtype=torch.float32, device="cpu") * rope.theta ** exponents)
    inv_freq = 1.0 / (rope.theta ** exponents)
    if rope.kind == "linear":
        return inv_freq / rope.factor
    if rope.kind == "yarn":
        return yarn_inv_freq(rope, head_dim)
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


def yarn_inv_freq(rope: RopeConfig, head_dim: int) -> torch.Tensor:
    """YaRN (arXiv 2309.06180): frequencies that turn fewer than beta_slow times over the pre-training context
    are divided by `factor` (interpolated), those turning more than beta_fast times kept (extrapolated), a
    linear ramp over the dimensions between; transformers' arithmetic, in float32."""
    def dim_of(rotations: float) -> float:  # the dimension whose frequency turns `rotations` times
        return head_dim * math.log(rope.original_max_position_embeddings / (rotations * 2 * math.pi)) / (
            2 * math.log(rope.theta))

    low, high = dim_of(rope.beta_fast), dim_of(rope.beta_slow)
    if rope.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, head_dim - 1)
    if low == high:
        high += 0.001  # (no division by zero)
    # (on the CPU explicitly: a model is built under the meta device, and this buffer must hold values)
    ramp = ((torch.arange(head_dim // 2, dtype=torch.float32, device="cpu") - low) / (high - low)).clamp(0, 1)
    pos_freqs = rope.theta ** (torch.arange(0, head_dim, 2, device="cpu").to(dtype=torch.float) / head_dim)
    kept = 1 - ramp  # the share of each dimension extrapolated
    return 1.0 / (rope.factor * pos_freqs) * (1 - kept) + 1.0 / pos_freqs * kept


class Rotary(nn.Module):
    """Rotary embedding for arbitrary per-token positions (tree nodes share positions with siblings)."""

    kernels: Kernels = EAGER

    def __init__(self, rope: RopeConfig, head_dim: int):
        super().__init__()
        self.register_buffer("inv_freq", rope_inv_freq(rope, head_dim), persistent=False)
        if rope.partial != 1.0 and rope.attention_factor != 1.0:
            # only the rotated dimensions' tables are scaled: the others pass through as they are (cos 1, sin 0)
            rotated = (self.inv_freq != 0).repeat(2)
            self.register_buffer("scale", torch.where(rotated, rope.attention_factor, 1.0), persistent=False)
        else:
            self.scale = rope.attention_factor  # YaRN's and LongRoPE's cos/sin scale (1 for the others)

    def forward(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        # positions: [B, T] -> cos, sin: [B, T, head_dim]
        return self.kernels.rotary_tables(positions, self.inv_freq, dtype, self.scale)
