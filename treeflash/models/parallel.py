"""Tensor-parallel pieces of the target decoder: which slice of each weight a rank holds, and the linear
layer that sums the ranks' partial outputs.

Megatron-style split over N ranks, one implementation of the decoder for every N:
- q/k/v and gate/up are column-parallel: a rank holds the rows of its heads (its slice of the MLP's
  intermediate width), so these stay plain `nn.Linear`s of the rank's width and need no communication;
- o_proj and down_proj are row-parallel: a rank holds the matching columns, computes a partial sum of the
  output, and one all-reduce gives every rank the full output (`RowParallelLinear`);
- embedding, norms and the output head are replicated (the replicated drafter borrows both whole), but
  the target's logits are computed vocab-parallel: each rank multiplies by its rows of the head and one
  all-gather assembles them, so each rank reads 1/N of the head per forward (measured and argued in
  docs/tensor-parallel.md).

A rank's decoder is the ordinary `Transformer` built from `Shard.config` (its own head counts and MLP
width), with o_proj/down_proj swapped for `RowParallelLinear` before any weight is read, and every weight
read as the rank's slice straight from the safetensors file (`Shard.read`): no rank reads the whole model.
KV heads fewer than N are replicated: each KV head serves N / num_kv_heads consecutive ranks.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from treeflash.config import ModelConfig
from treeflash.models.transformer import Transformer


class TensorParallelConfigError(ValueError):
    """The target cannot be split over this many ranks."""


def check_shardable(cfg: ModelConfig, size: int) -> None:
    """Refuse, before any weight is read, a split that does not come out even."""
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise TensorParallelConfigError(f"tensor_parallel_size must be a positive integer, got {size!r}")
    if cfg.experts is not None and size > 1:
        raise TensorParallelConfigError(f"tensor parallelism does not split a mixture of experts ({cfg.architecture}) "
                                        f"yet: run it on one device (tensor_parallel_size=1)")
    if cfg.fp8 is not None and size > 1:  # (its scales' blocks would have to be cut with the weights)
        raise TensorParallelConfigError("tensor parallelism does not split an FP8 checkpoint yet: run it on one "
                                        "device (tensor_parallel_size=1)")
    if cfg.architecture in ("Phi3ForCausalLM", "Gemma3ForCausalLM") and size > 1:
        # (Phi-3's q/k/v and gate/up weights are fused; Gemma 3's split is not tested)
        raise TensorParallelConfigError(f"tensor parallelism does not split {cfg.architecture} yet: run it on one "
                                        f"device (tensor_parallel_size=1)")
    problems = []  # (each as _uneven checks it)
    if cfg.num_heads % size:
        problems.append(f"{cfg.num_heads} attention heads")
    if cfg.num_kv_heads % size and size % cfg.num_kv_heads:
        problems.append(f"{cfg.num_kv_heads} KV heads (they must divide by {size}, or divide {size} to be "
                        f"replicated)")
    if cfg.intermediate_size % size:
        problems.append(f"MLP width {cfg.intermediate_size}")
    if problems:
        sizes = [n for n in range(1, cfg.num_heads + 1) if not _uneven(cfg, n)]
        raise TensorParallelConfigError(
            f"tensor_parallel_size={size} does not split this {cfg.architecture} evenly: " + ", ".join(problems)
            + f" do not divide by {size}; sizes that do: {', '.join(map(str, sizes))}")


def _uneven(cfg: ModelConfig, size: int) -> bool:
    return bool(cfg.num_heads % size or (cfg.num_kv_heads % size and size % cfg.num_kv_heads)
                or cfg.intermediate_size % size)


class Communicator:
    """Sums a tensor over the ranks of one tensor-parallel group, in place.

    Built before the weights are loaded (the layers keep a reference) and connected to its process group
    once every rank has loaded, so loading runs in parallel and no rank waits on a peer that is still
    reading. Works inside a CUDA graph capture with NCCL: the all-reduce is recorded like any kernel.
    """

    def __init__(self) -> None:
        self.group = None  # a torch.distributed backend (ProcessGroupGloo / ProcessGroupNCCL)

    def connect(self, group) -> None:
        self.group = group

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        self._need_group().allreduce([x]).wait()
        return x

    def all_gather(self, x: torch.Tensor) -> torch.Tensor:
        """x: [n, ...] on every rank -> [ranks * n, ...], rank 0's rows first (the same on every rank)."""
        group = self._need_group()
        out = x.new_empty((group.size() * x.shape[0], *x.shape[1:]))
        group._allgather_base(out, x).wait()
        return out

    def _need_group(self):
        if self.group is None:
            raise RuntimeError("tensor-parallel communicator used before it was connected")
        return self.group


class RowParallelLinear(nn.Linear):
    """A linear layer holding a slice of the input features; the ranks' outputs are summed.

    weight: [out, in / N]. The bias (if any) is whole and added once, after the sum.
    """

    def __init__(self, in_features: int, out_features: int, bias: bool, comm: Communicator):
        super().__init__(in_features, out_features, bias=bias)
        self.comm = comm

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: [..., in / N] -> [..., out], identical on every rank
        y = self.comm.all_reduce(F.linear(x, self.weight))
        return y if self.bias is None else y + self.bias


class ShardedTransformer(Transformer):
    """A rank's decoder: the shared Transformer code on the rank's shapes; logits computed vocab-parallel."""

    def __init__(self, cfg: ModelConfig, shard: "Shard"):
        super().__init__(cfg)
        self.shard = shard

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        # hidden: [..., hidden] -> [..., V] float32, bit-identical on every rank
        weight, n = self.output_weight, self.shard.size
        vocab = weight.shape[0]
        chunk = -(-vocab // n)  # the last rank's rows are padded when N does not divide V
        start = min(self.shard.rank * chunk, vocab)
        stop = min(start + chunk, vocab)
        part = F.pad(F.linear(hidden, weight[start:stop]).float(), (0, chunk - (stop - start)))
        gathered = self.shard.comm.all_gather(part.movedim(-1, 0).contiguous())  # [N * chunk, ...]
        return gathered.movedim(0, -1)[..., :vocab].contiguous()


# Parameter name (without the leading "model.") -> what kind of slice a rank reads.
_SLICED = re.compile(r"layers\.\d+\.(self_attn\.(q|k|v|o)_proj|mlp\.(gate|up|down)_proj)\.(weight|bias)$")


@dataclass(frozen=True)
class Shard:
    """Rank `rank` of `size`: builds its decoder and reads its slice of every weight."""

    rank: int
    size: int
    comm: Communicator

    def config(self, cfg: ModelConfig) -> ModelConfig:
        """The rank's decoder shape: its heads and MLP columns (head_dim and hidden size unchanged)."""
        check_shardable(cfg, self.size)
        return dataclasses.replace(cfg, num_heads=cfg.num_heads // self.size,
                                   num_kv_heads=max(cfg.num_kv_heads // self.size, 1),
                                   intermediate_size=cfg.intermediate_size // self.size)

    def build(self, cfg: ModelConfig) -> nn.Module:
        """The rank's Transformer (call on the meta device): the shared decoder code with row-parallel o/down."""
        model = ShardedTransformer(self.config(cfg), self)
        for layer in model.layers:
            for owner, name in ((layer.self_attn, "o_proj"), (layer.mlp, "down_proj")):
                old = getattr(owner, name)
                setattr(owner, name, RowParallelLinear(old.in_features, old.out_features, old.bias is not None,
                                                       self.comm))
        return model

    def span(self, name: str, cfg: ModelConfig) -> tuple[int, int, int, int] | None:
        """(dim, start, stop, whole) of the rank's slice of parameter `name` (whole: the model's extent along
        dim), or None when it is replicated."""
        m = _SLICED.search(name)
        if m is None:
            return None
        proj, leaf = m.group(1).rsplit(".", 1)[-1], m.group(4)
        d, r, n = cfg.head_dim, self.rank, self.size
        if proj in ("o_proj", "down_proj"):
            if leaf == "bias":
                return None  # added once after the all-reduce
            width = cfg.num_heads * d if proj == "o_proj" else cfg.intermediate_size
            return 1, r * width // n, (r + 1) * width // n, width
        if proj == "q_proj":
            width = cfg.num_heads * d
            return 0, r * width // n, (r + 1) * width // n, width
        if proj in ("k_proj", "v_proj"):
            width = cfg.num_kv_heads * d
            if cfg.num_kv_heads >= n:
                per = cfg.num_kv_heads // n
                return 0, r * per * d, (r + 1) * per * d, width
            head = r // (n // cfg.num_kv_heads)  # replicated: consecutive ranks share one KV head
            return 0, head * d, (head + 1) * d, width
        width = cfg.intermediate_size  # gate_proj, up_proj
        return 0, r * width // n, (r + 1) * width // n, width

    def read(self, name: str, cfg: ModelConfig, tensor_slice) -> torch.Tensor:
        """The rank's part of one checkpoint tensor, read through safetensors' `get_slice` (only it is read)."""
        span = self.span(name, cfg)
        if span is None:
            return tensor_slice[:]  # load_weights checks its whole shape
        dim, start, stop, whole = span
        shape = tuple(tensor_slice.get_shape())
        if len(shape) <= dim or shape[dim] != whole:
            # Checked here: a slice of a wider tensor would pass load_weights' check of the rank's shape.
            raise ValueError(f"tensor {name} has shape {shape}, config implies {whole} along dim {dim}")
        return tensor_slice[start:stop] if dim == 0 else tensor_slice[:, start:stop]
