"""The decoder's small elementwise pieces as pure functions, eager or compiled, and the fused projections.

Inside a CUDA graph a round costs what its kernels cost, and most of a decoder layer's kernels are tiny:
RMSNorm written out is six (cast, square, mean, add, rsqrt, scale) plus the weight, rotary is five, the
MLP's silu and product two, the residuals one each. `Kernels` names these pieces once; the model code
calls them through `module.kernels`, so the eager CPU path and the compiled GPU path are the same code:

- `EAGER`: the functions as written (the CPU, tests, `compile_kernels=False`);
- `COMPILED`: the same functions through `torch.compile` (Inductor fuses each into one or two Triton
  kernels). CUDA only; compiled lazily at first call, over rows with the row count dynamic, so each
  piece compiles about twice per process (N = 1 and N >= 2) whatever the batch sizes and budgets.

`fuse_projections` is the other half: q/k/v and gate/up become one GEMM each (one weight read, one
launch). It lays the checkpoint's weights out side by side in one tensor and makes the original
parameters views of it, so names, shapes and values of `named_parameters()` stay HF's (checkpoints,
tensor-parallel slices and training see no difference) and no memory is duplicated. It works on a
tensor-parallel rank's slices as they are (a rank's q/k/v are its own heads).

The fused tensors carry no gradient: with autograd on (training), the forward takes the separate
projections (the views, which do), so a fused model still trains.

`use_fast_path(model, fused, kernels)` switches both, and can switch back (the fused weights stay; only
the forward's choice changes), so one process can time both paths on the same weights.

Every projection goes through `linear` (the models' `Linear` layers, the fused weights, the lm_head): F.linear,
or on the CPU oneDNN's product with a prepacked copy of the weight that `prepack_cpu` attached (the
`Speculator` does, for float32 models on the CPU and bfloat16 ones where the CPU multiplies bfloat16 natively,
unless `cpu_prepack=False`). MKL's sgemm, F.linear's there in float32, packs the weight again at every call; and
it gives a row different bits with other rows beside it than alone (~1e-6), where the prepacked product gave
every row the same bits from 1 to 17 rows on the x86 CPU measured (benchmarks/cpu-onednn-linear). In bfloat16
F.linear took longer still (benchmarks/cpu-bf16-prepack).
"""

from __future__ import annotations

import functools
import os
import warnings
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn


# --- the pieces, over rows: x [N, ...], N = tokens of the batch (a reshape of [B, T, ...], no copy) ----------
def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, offset: bool = False) -> torch.Tensor:
    # x: [..., D]. Normalise in float32 and cast back before the weight, as the HF checkpoints were trained;
    # offset (Gemma): times 1 + weight in float32, then the cast.
    dtype = x.dtype
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    if offset:
        return (h * (1.0 + weight.float())).to(dtype)
    return weight * h.to(dtype)


def add_rms_norm(x: torch.Tensor, delta: torch.Tensor, weight: torch.Tensor, eps: float, offset: bool = False
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """The residual sum x + delta (rounded to x's dtype, as eagerly) and its norm: one kernel compiled."""
    x = x + delta
    return x, rms_norm(x, weight, eps, offset)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    # x: [..., D] with cos, sin broadcasting to it; the "rotate half" convention of the HF checkpoints.
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


def norm_rotary(x: torch.Tensor, weight: torch.Tensor | None, eps: float, cos: torch.Tensor,
                sin: torch.Tensor, offset: bool = False) -> torch.Tensor:
    # x: [N, H, D]; cos, sin: [N, 1, D]. Per-head norm (Qwen3, Gemma; weight None: none), then rotary.
    if weight is not None:
        x = rms_norm(x, weight, eps, offset)
    return apply_rotary(x, cos, sin)


def qk_norm_rotary(x: torch.Tensor, q_weight: torch.Tensor, k_weight: torch.Tensor, q_heads: int, eps: float,
                   cos: torch.Tensor, sin: torch.Tensor, offset: bool = False) -> torch.Tensor:
    # x: [N, Hq + Hk, D], queries' heads then keys'. One weight row per head, so both norms are one reduction
    # over every head (per slice, Inductor made a reduction each and two pointwise kernels).
    h, d = x.shape[1:]
    weight = torch.cat([q_weight.expand(q_heads, d), k_weight.expand(h - q_heads, d)])
    return norm_rotary(x, weight, eps, cos, sin, offset)


def rotary_tables(positions: torch.Tensor, inv_freq: torch.Tensor, dtype: torch.dtype,
                  scale: float | torch.Tensor = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    # positions: [N] -> cos, sin: [N, head_dim], times `scale` (YaRN's or LongRoPE's; 1.0 leaves every bit as it is;
    # a [head_dim] tensor where only some dimensions rotate)
    freqs = positions.float()[..., None] * inv_freq.float()
    emb = torch.cat([freqs, freqs], dim=-1)
    return (emb.cos() * scale).to(dtype), (emb.sin() * scale).to(dtype)


def silu_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    # gate, up: [N, I] (with fused projections, two halves of one GEMM's output)
    return F.silu(gate) * up


def gelu_tanh_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    # Gemma's gate: GELU with the tanh approximation (transformers' gelu_pytorch_tanh)
    return F.gelu(gate, approximate="tanh") * up


def pin_triton_cache_dir() -> str:
    """Keep every compiled Triton kernel of this process (ours and Inductor's) in one directory that every
    process finds: $TRITON_CACHE_DIR where set, else the treeflash cache's triton/ (`$TREEFLASH_CACHE`, else
    ~/.cache/treeflash). Returns it. Called before a CUDA engine compiles anything.

    Why: Triton reads $TRITON_CACHE_DIR at each compile, and Inductor sets it (to its own directory under
    /tmp) the first time it builds a kernel wrapper. Which kernels went where then depended on what ran
    first in a process: on the H200 a restarted warm-up compiled 51 kernels again that the process before it
    had compiled (the tree builder's, seconds each), and took 81 s where it now takes 7
    (benchmarks/h200-capture-cost)."""
    directory = os.environ.get("TRITON_CACHE_DIR")
    if not directory:
        from treeflash.gguf_convert import default_cache_dir

        directory = str(default_cache_dir() / "triton")
        os.environ["TRITON_CACHE_DIR"] = directory
    return directory


@functools.cache
def _compiled(fn: Callable) -> Callable:
    # One compiled wrapper per piece and process, compiled at its first call. dynamic=None plus the
    # row axis of every argument that has one marked dynamic (`Kernels._call`), from the first call on:
    # one graph for every token count N >= 2 (and one for N = 1, which dynamo always specialises), while
    # the hidden and head widths stay constants, so the reductions over them are specialised. Each piece
    # is its own code object, so the hidden-width norm and the head-width norm never make each other's
    # widths dynamic.
    return torch.compile(fn, dynamic=None, fullgraph=True)


@dataclass(frozen=True)
class Kernels:
    """The pieces a decoder's modules call (`module.kernels`), on [B, T, ...] tensors.

    Each reshapes its input to rows (a view) and runs the row function above, eagerly or compiled;
    the values are the same either way up to the compiled kernels' rounding (float32 inside).
    """

    compiled: bool = False

    def _call(self, fn: Callable, *args, rows: tuple[int, ...] = (0,)):
        # rows: the positions of the arguments whose first axis is the row count N.
        if not self.compiled:
            return fn(*args)
        # Every one of them marked, not only the first: an unmarked one (delta, up, cos, sin) made dynamo
        # specialise N at the first call and compile a second, dynamic graph at the next N, so the process's
        # first prompt ran kernels no later prompt of the same length did, with other float32 bits in
        # layer 0 (an H100, benchmarks/gpu-check-pool: the first request's tree scores 1-2 ulps off).
        for i in rows:
            torch._dynamo.maybe_mark_dynamic(args[i], 0)
        # A piece sees a few layouts (q and k heads, fused and drafter-context strides, N = 1): allow
        # their recompiles rather than fall back to eager after dynamo's default limit of 8.
        with torch._dynamo.config.patch(recompile_limit=64):
            return _compiled(fn)(*args)

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float, offset: bool = False) -> torch.Tensor:
        # x: [..., D] -> [..., D]
        return self._call(rms_norm, x.reshape(-1, x.shape[-1]), weight, eps, offset).view(x.shape)

    def add_rms_norm(self, x: torch.Tensor, delta: torch.Tensor, weight: torch.Tensor, eps: float,
                     offset: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        # x, delta: [..., D] -> (x + delta, its norm), both [..., D]
        d = x.shape[-1]
        total, normed = self._call(add_rms_norm, x.reshape(-1, d), delta.reshape(-1, d), weight, eps, offset,
                                   rows=(0, 1))
        return total.view(x.shape), normed.view(x.shape)

    def _over_heads(self, fn: Callable, x: torch.Tensor, args: tuple, cos: torch.Tensor, sin: torch.Tensor,
                    offset: bool = False) -> torch.Tensor:
        # fn(rows [B*T, H, D], *args, cos, sin, offset) on x: [B, T, H, D]; cos, sin: [B, T, D] -> [B, H, T, D]
        # (a view)
        b, t, h, d = x.shape
        cos, sin = (c.expand(b, t, d).reshape(b * t, 1, d) for c in (cos, sin))
        rows = (0, len(args) + 1, len(args) + 2)  # x, cos, sin
        out = self._call(fn, x.reshape(b * t, h, d), *args, cos, sin, offset, rows=rows)
        return out.view(b, t, h, d).transpose(1, 2)

    def norm_rotary(self, x: torch.Tensor, weight: torch.Tensor | None, eps: float, cos: torch.Tensor,
                    sin: torch.Tensor, offset: bool = False) -> torch.Tensor:
        # x: [B, T, H, D]; cos, sin: [B, T, D] -> [B, H, T, D] (a transposed view)
        return self._over_heads(norm_rotary, x, (weight, eps), cos, sin, offset)

    def qk_norm_rotary(self, x: torch.Tensor, q_weight: torch.Tensor | None, k_weight: torch.Tensor | None,
                       eps: float, cos: torch.Tensor, sin: torch.Tensor, q_heads: int, offset: bool = False
                       ) -> tuple[torch.Tensor, torch.Tensor]:
        # x: [B, T, Hq + Hk, D], the queries' heads then the keys' (adjacent in the fused q/k/v output);
        # cos, sin: [B, T, D] -> q [B, Hq, T, D], k [B, Hk, T, D] (transposed views). One piece for both:
        # rotary alone (no per-head norms, e.g. Llama), or the norms too (Qwen3) as one reduction with a weight
        # row per head, one kernel a layer on the H200 where two pieces made two and q/k slices inside one piece
        # four (benchmarks/h200-qk-one-piece: Qwen3-8B rounds with trees or batches 1-3% faster, AR steps alike).
        if q_weight is None:
            out = self.norm_rotary(x, None, eps, cos, sin)
        else:
            out = self._over_heads(qk_norm_rotary, x, (q_weight, k_weight, q_heads, eps), cos, sin, offset)
        return out[:, :q_heads], out[:, q_heads:]

    def rotary_tables(self, positions: torch.Tensor, inv_freq: torch.Tensor, dtype: torch.dtype, scale: float = 1.0
                      ) -> tuple[torch.Tensor, torch.Tensor]:
        # positions: [B, T] -> cos, sin: [B, T, head_dim]
        cos, sin = self._call(rotary_tables, positions.reshape(-1), inv_freq, dtype, scale)
        return cos.view(*positions.shape, -1), sin.view(*positions.shape, -1)

    def silu_mul(self, gate: torch.Tensor, up: torch.Tensor, activation: str = "silu") -> torch.Tensor:
        # gate, up: [..., I] -> [..., I]; activation "gelu_tanh": Gemma's gate
        width = gate.shape[-1]
        fn = gelu_tanh_mul if activation == "gelu_tanh" else silu_mul
        return self._call(fn, gate.reshape(-1, width), up.reshape(-1, width), rows=(0, 1)).view(gate.shape)


EAGER = Kernels(compiled=False)
COMPILED = Kernels(compiled=True)  # CUDA only (Inductor's Triton kernels); nothing compiles until called


def fuse_projections(model: nn.Module) -> None:
    """Give every attention one q/k/v weight and every MLP one gate/up weight (see the module docstring).

    Idempotent. The original parameters become views of the fused tensors: same names, shapes, values.
    """
    from treeflash.models.layers import MLP
    from treeflash.models.transformer import Attention

    for module in model.modules():
        if isinstance(module, Attention) and module.qkv is None:
            module.qkv = _fuse([module.q_proj, module.k_proj, module.v_proj])
        elif isinstance(module, MLP) and module.gate_up is None:
            module.gate_up = _fuse([module.gate_proj, module.up_proj])


def _fuse(linears: list[nn.Linear]) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(weight, bias) of one projection over the concatenated outputs of `linears`, whose parameters
    become views of them. Plain tensors, not parameters: `named_parameters()` keeps HF's names only."""
    weight = torch.cat([lin.weight.detach() for lin in linears])
    has_bias = [lin.bias is not None for lin in linears]
    if any(has_bias) and not all(has_bias):
        raise ValueError("cannot fuse projections where only some have a bias")
    bias = torch.cat([lin.bias.detach() for lin in linears]) if all(has_bias) else None
    start = 0
    for lin in linears:
        stop = start + lin.out_features
        lin.weight = nn.Parameter(weight[start:stop], requires_grad=lin.weight.requires_grad)
        if bias is not None:
            lin.bias = nn.Parameter(bias[start:stop], requires_grad=lin.bias.requires_grad)
        start = stop
    return weight, bias


# --- projections on the CPU through oneDNN's prepacked weights ---------------------------------------------------
def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """F.linear(x, weight, bias); on the CPU, without autograd, oneDNN's product with the weight's prepacked copy
    where `prepack_cpu` attached one and the weight has not changed in place since (a training step changes it).
    F.linear runs MKL's sgemm there, which packs the weight again at every call: on a 2-core x86 CPU, over a
    SmolLM2-sized stack of projections, 9-row products took 1.8x one-row ones with MKL and 1.4x prepacked, and
    prepacked one-row products 0.75x MKL's (benchmarks/cpu-onednn-linear)."""
    packed = getattr(weight, "_onednn", None)
    if packed is None or torch.is_grad_enabled() or x.device.type != "cpu" or packed[0] != _version(weight):
        return F.linear(x, weight, bias)
    rows = x.reshape(-1, x.shape[-1]).contiguous()
    return torch.ops.mkldnn._linear_pointwise(rows, packed[1], bias, "none", [], "").view(*x.shape[:-1], -1)


def prepack_cpu(weights: list[torch.Tensor], rows: int = 16) -> bool:
    """Attach to each float32 CPU weight [N, K], and bfloat16 one where the CPU has bfloat16 products
    (`bf16_products`), oneDNN's prepacked copy (for products of about `rows` rows), which `linear` uses: a second
    copy of the weights in memory. False, attaching nothing, where this PyTorch has no oneDNN linear, or where the
    copies would take more than half the memory free now (a warning says so). Unpacked, bfloat16 weights took
    F.linear's product, with which the default pair's DDTree-8 decoding ran 0.73x as fast as with them packed on
    a 2-core AVX-512 CPU (benchmarks/cpu-bf16-prepack)."""
    mkldnn = torch.ops.mkldnn
    if not (torch.backends.mkldnn.is_available() and hasattr(mkldnn, "_reorder_linear_weight")
            and hasattr(mkldnn, "_linear_pointwise")):
        return False
    dtypes = (torch.float32, torch.bfloat16) if bf16_products() else (torch.float32,)
    weights = [w for w in weights if w.device.type == "cpu" and w.dtype in dtypes and w.dim() == 2]
    extra, free = sum(w.numel() * w.element_size() for w in weights), _free_memory()
    if free is not None and extra > free // 2:
        warnings.warn(f"not prepacking the CPU projections for oneDNN: their copy ({extra / 2**30:.1f} GiB) would "
                      f"take more than half the free memory ({free / 2**30:.1f} GiB); F.linear it is", stacklevel=2)
        return False
    with torch.no_grad():
        for weight in weights:
            weight._onednn = (_version(weight), mkldnn._reorder_linear_weight(weight.detach().contiguous(), rows))
    return True


def bf16_products() -> bool:
    """Whether oneDNN multiplies bfloat16 natively on this CPU (AVX-512 BF16 or AMX; elsewhere it would emulate
    them, and bfloat16 weights stay with F.linear)."""
    check = getattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", None)
    try:
        return bool(check is not None and torch.backends.mkldnn.is_available() and check())
    except RuntimeError:
        return False


def _free_memory() -> int | None:
    """Bytes of physical memory free now (Linux and the like; None where the system does not say)."""
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def _version(t: torch.Tensor) -> int | None:
    try:
        return t._version
    except RuntimeError:  # an inference tensor keeps no version counter (and cannot change outside inference mode)
        return None


def projection_weights(model: nn.Module) -> list[torch.Tensor]:
    """The weights a model's forward multiplies through `linear`: every `Linear` layer's, and the fused q/k/v and
    gate/up ones where made."""
    weights = [m.weight for m in model.modules() if isinstance(m, Linear)]
    for m in model.modules():
        for fused in (getattr(m, "qkv", None), getattr(m, "gate_up", None)):
            if isinstance(fused, tuple):
                weights.append(fused[0])
    return weights


class Linear(nn.Linear):
    """nn.Linear (same parameters, same names) whose product is `linear`'s."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.weight, self.bias)


def use_fast_path(model: nn.Module, fused: bool, kernels: Kernels = EAGER) -> None:
    """Which projections (fused: one GEMM for q/k/v and for gate/up) and which pieces the model's
    forward uses. Switching back is allowed: the fused weights stay, only the forward's choice changes.

    The compiled pieces need CUDA (Inductor's Triton kernels; the CPU never compiles); fusing works anywhere.
    """
    if fused:
        fuse_projections(model)
    for module in model.modules():
        if isinstance(getattr(module, "kernels", None), Kernels):
            module.kernels = kernels
        if hasattr(module, "use_fused"):
            module.use_fused = fused
