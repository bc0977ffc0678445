"""The DFlash block-diffusion drafter (z-lab checkpoint format).

One pass over [bonus, MASK x (block_size - 1)] proposes a distribution for every depth of the next
block. The drafter owns no embedding and no lm_head: it borrows the target's. It is conditioned by
KV injection: the target's hidden states at `target_layer_ids` (concatenated, projected by `fc`,
normed by `hidden_norm`) become extra keys/values in every drafter layer, through that layer's own
k_proj/k_norm/v_proj at the context tokens' positions. Those context K/V depend only on the
committed tokens, so they are cached per slot; the block's own K/V are overwritten every round.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from treeflash.config import ConfigError, ModelConfig, config_value
from treeflash.kv_cache import KVCache
from treeflash.models.layers import RMSNorm, Rotary
from treeflash.models.transformer import DecoderLayer


class DrafterMismatchError(ValueError):
    """The drafter cannot condition on / share weights with this target."""


def default_target_layer_ids(num_target_layers: int, num_draft_layers: int) -> list[int]:
    """K ids spread evenly over [1, N-3]; a single draft layer reads the middle layer."""
    if num_draft_layers == 1:
        return [num_target_layers // 2]
    span = num_target_layers - 4
    return [round(1 + i * span / (num_draft_layers - 1)) for i in range(num_draft_layers)]


@dataclass(frozen=True)
class DrafterConfig:
    layers: ModelConfig  # the Qwen3-style decoder layers of the drafter
    block_size: int
    mask_token_id: int
    target_layer_ids: tuple[int, ...]
    num_target_layers: int
    input_embedding_scale: float = 1.0
    output_multiplier: float = 1.0
    final_logit_softcapping: float | None = None

    @property
    def depth(self) -> int:
        """Depths one draft pass proposes (the block minus its bonus token)."""
        return self.block_size - 1

    @staticmethod
    def from_hf(cfg: dict[str, Any]) -> "DrafterConfig":
        if "DFlashDraftModel" not in (cfg.get("architectures") or []):
            raise DrafterMismatchError(
                f"not a DFlash drafter: architectures={cfg.get('architectures')} (expected ['DFlashDraftModel'])")
        # The z-lab format allows these at top level or in dflash_config (which wins).
        merged = {**cfg, **config_value(cfg, "dflash_config", dict, {})}
        layers = ModelConfig.from_hf({**cfg, "architectures": ["Qwen3ForCausalLM"], "layer_types": None})
        if cfg.get("num_target_layers") is None:
            raise DrafterMismatchError("drafter config lacks num_target_layers")
        num_target_layers = config_value(cfg, "num_target_layers", int, minimum=1)
        ids = config_value(merged, "target_layer_ids", list, None) or default_target_layer_ids(
            num_target_layers, layers.num_layers)
        if not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
            raise ConfigError(f"config.json: 'target_layer_ids' must be a list of integers, got {ids!r}")
        mask = config_value(merged, "mask_token_id", int, None)
        if mask is None:
            raise DrafterMismatchError("drafter config lacks dflash_config.mask_token_id")
        block_size = config_value(merged, "block_size", int, 16)
        if block_size < 2:
            raise DrafterMismatchError(f"block_size must be at least 2, got {block_size}")
        softcap = config_value(merged, "final_logit_softcapping", float, None)
        return DrafterConfig(
            layers=layers,
            block_size=block_size,
            mask_token_id=mask,
            target_layer_ids=tuple(ids),
            num_target_layers=num_target_layers,
            input_embedding_scale=config_value(merged, "input_embedding_scale", float, 1.0),
            output_multiplier=config_value(merged, "output_multiplier", float, 1.0),
            final_logit_softcapping=softcap or None,
        )

    def to_hf(self) -> dict[str, Any]:
        """config.json in the z-lab format (readable by the reference `dflash` package)."""
        c = self.layers
        dflash: dict[str, Any] = {"mask_token_id": self.mask_token_id, "target_layer_ids": list(self.target_layer_ids)}
        if self.input_embedding_scale != 1.0:
            dflash["input_embedding_scale"] = self.input_embedding_scale
        if self.output_multiplier != 1.0:
            dflash["output_multiplier"] = self.output_multiplier
        if self.final_logit_softcapping:
            dflash["final_logit_softcapping"] = self.final_logit_softcapping
        rope = {k: v for k, v in asdict(c.rope).items()}
        return {
            "architectures": ["DFlashDraftModel"],
            "model_type": "qwen3",
            "block_size": self.block_size,
            "dflash_config": dflash,
            "num_target_layers": self.num_target_layers,
            "vocab_size": c.vocab_size,
            "hidden_size": c.hidden_size,
            "intermediate_size": c.intermediate_size,
            "num_hidden_layers": c.num_layers,
            "num_attention_heads": c.num_heads,
            "num_key_value_heads": c.num_kv_heads,
            "head_dim": c.head_dim,
            "rms_norm_eps": c.rms_norm_eps,
            "rope_theta": rope["theta"],
            "rope_parameters": {"rope_theta": rope["theta"], "rope_type": "default"},
            "attention_bias": c.qkv_bias,
            "hidden_act": "silu",
            "max_position_embeddings": c.max_position_embeddings,
            "tie_word_embeddings": False,
            "layer_types": ["full_attention"] * c.num_layers,
        }

    def check_target(self, target: ModelConfig) -> None:
        """Refuse, before any generation, a drafter that cannot run on this target."""
        problems = []
        if self.layers.hidden_size != target.hidden_size:
            problems.append(f"hidden size {self.layers.hidden_size} != target's {target.hidden_size}")
        if self.num_target_layers != target.num_layers:
            problems.append(f"trained for a {self.num_target_layers}-layer target, this one has {target.num_layers}")
        bad_ids = [i for i in self.target_layer_ids if not 0 <= i < target.num_layers]
        if bad_ids:
            problems.append(f"target_layer_ids {bad_ids} outside the target's {target.num_layers} layers")
        if self.layers.vocab_size != target.vocab_size:
            problems.append(f"vocabulary {self.layers.vocab_size} != target's {target.vocab_size}")
        if not 0 <= self.mask_token_id < target.vocab_size:
            problems.append(f"mask_token_id {self.mask_token_id} outside the target's embedding table "
                            f"(0..{target.vocab_size - 1})")
        if problems:
            raise DrafterMismatchError("drafter does not fit the target: " + "; ".join(problems))


class DFlashDrafter(nn.Module):
    """Parameter names are the z-lab checkpoint's tensor names."""

    def __init__(self, cfg: DrafterConfig):
        super().__init__()
        self.config = cfg
        c = cfg.layers
        self.fc = nn.Linear(len(cfg.target_layer_ids) * c.hidden_size, c.hidden_size, bias=False)
        self.hidden_norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.layers = nn.ModuleList(DecoderLayer(c) for _ in range(c.num_layers))
        self.norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.rotary = Rotary(c.rope, c.head_dim)

    def new_cache(self, slots: int, capacity: int) -> KVCache:
        c, p = self.config.layers, self.fc.weight
        return KVCache.allocate(c.num_layers, slots, c.num_kv_heads, capacity, c.head_dim, p.dtype, p.device)

    def add_context(self, features: torch.Tensor, positions: torch.Tensor, cache: KVCache, rows: torch.Tensor) -> None:
        """Write the context K/V of committed tokens: features [B, C, K*H] (target layer outputs)."""
        context = self.hidden_norm(self.fc(features.to(self.fc.weight.dtype)))
        cos, sin = self.rotary(positions, context.dtype)
        for i, layer in enumerate(self.layers):
            k, v = layer.self_attn.project_kv(context, cos, sin)
            cache.write(i, k, v, rows)

    def forward(self, block_embeddings: torch.Tensor, positions: torch.Tensor, cache: KVCache,
                rows: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """block_embeddings: [B, block, H] (target embedding of [bonus, MASK...] times the input scale).

        The mask lets every block token see the slot's context and the whole block (bidirectional).
        Returns the final-normed hidden states of the block [B, block, H].
        """
        x = block_embeddings
        cos, sin = self.rotary(positions, x.dtype)
        for i, layer in enumerate(self.layers):
            x = layer(x, cos, sin, cache, i, rows, mask)
        return self.norm(x)

    def logits(self, hidden: torch.Tensor, output_weight: torch.Tensor) -> torch.Tensor:
        logits = F.linear(hidden, output_weight).float() * self.config.output_multiplier
        cap = self.config.final_logit_softcapping
        return torch.tanh(logits / cap) * cap if cap else logits


def save_drafter(drafter: DFlashDrafter, path: str | Path) -> Path:
    from safetensors.torch import save_file

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(drafter.config.to_hf(), indent=2))
    tensors = {name: p.detach().contiguous().cpu() for name, p in drafter.named_parameters()}
    save_file(tensors, str(path / "model.safetensors"))
    return path
