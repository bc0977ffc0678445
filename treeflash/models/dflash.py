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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from treeflash.config import ConfigError, ModelConfig, UnsupportedModelError, config_value
from treeflash.kv_cache import KVCache, PrefixKV
from treeflash.models.kernels import Linear, linear
from treeflash.models.layers import RMSNorm, Rotary
from treeflash.models.transformer import DecoderLayer, Transformer, run_layers


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
        archs = cfg.get("architectures")
        if not isinstance(archs, list) or "DFlashDraftModel" not in archs:
            raise DrafterMismatchError(
                f"not a DFlash drafter: architectures={cfg.get('architectures')} (expected ['DFlashDraftModel'])")
        # The z-lab format allows these at top level or in dflash_config (which wins).
        merged = {**cfg, **config_value(cfg, "dflash_config", dict, {})}
        # The reference's newer drafters may make a layer causal inside the block, or attend to a window of the
        # context ("sliding_attention", causal unless is_causal says otherwise): drafts this engine, which
        # attends to the whole context and the whole block, would not make. Refused rather than drafted
        # otherwise (the output would stay exact; the acceptance would not be the drafter's).
        layer_types = [str(t) for t in config_value(cfg, "layer_types", list, [])]
        if any(t != "full_attention" for t in layer_types) or cfg.get("use_sliding_window"):
            kinds = sorted(set(layer_types)) or ["sliding_attention"]
            raise UnsupportedModelError(
                f"drafter layers of types {kinds} (sliding_window {cfg.get('sliding_window')}): only full attention "
                f"over the whole context and block is supported")
        if config_value(cfg, "is_causal", bool, False):
            raise UnsupportedModelError("a drafter causal inside its block (is_causal: true) is not supported: "
                                        "its layers attend to the whole block")
        # The drafter's layers are dense Qwen3 ones whatever its target is (a copy of a mixture-of-experts
        # target's expert counts in its config.json means nothing to them).
        layers = ModelConfig.from_hf({**cfg, "architectures": ["Qwen3ForCausalLM"], "layer_types": None,
                                      "num_experts": None, "num_local_experts": None})
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
        if not 2 <= block_size <= layers.max_position_embeddings:
            raise DrafterMismatchError(f"block_size must be in [2, max_position_embeddings = "
                                       f"{layers.max_position_embeddings}], got {block_size}")
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
            "rope_theta": c.rope.theta,
            "rope_parameters": c.rope.to_hf(),
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
    """Parameter names are the z-lab checkpoint's tensor names.

    The whole drafting recipe lives here, shared by inference (`Speculator`) and training
    (`treeflash.train`): which target features condition the drafter (`context_features`), how a
    block is embedded (`embed_block`), the context K/V every layer sees (`context_kv`) and the pass
    itself (`forward`, through a slot KV cache or, for training, over explicit `PrefixKV`).
    """

    def __init__(self, cfg: DrafterConfig):
        super().__init__()
        self.config = cfg
        c = cfg.layers
        self.fc = Linear(len(cfg.target_layer_ids) * c.hidden_size, c.hidden_size, bias=False)
        self.hidden_norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.layers = nn.ModuleList(DecoderLayer(c) for _ in range(c.num_layers))
        self.norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.rotary = Rotary(c.rope, c.head_dim)
        self.draft_vocab: DraftVocab | None = None  # from the directory's draft_vocab.json (load_drafter)

    def new_cache(self, slots: int, capacity: int) -> KVCache:
        c, p = self.config.layers, self.fc.weight
        return KVCache.allocate(c.num_layers, slots, c.num_kv_heads, capacity, c.head_dim, p.dtype, p.device)

    # --- the recipe ----------------------------------------------------------------------------------
    def context_features(self, target: Transformer, captured: list[torch.Tensor]) -> torch.Tensor:
        """The conditioning features: HF `hidden_states[i + 1]` of every target layer id, concatenated.

        captured: the target's outputs of layers `target_layer_ids`, each [B, T, H] -> [B, T, K*H].
        HF's entry for the last layer is after the final norm, and DFlash checkpoints were trained on it.
        """
        last = self.config.num_target_layers - 1
        ids = self.config.target_layer_ids
        return torch.cat([target.norm(f) if i == last else f for i, f in zip(ids, captured)], -1)

    def embed_block(self, target: Transformer, first: torch.Tensor) -> torch.Tensor:
        """first: [...] the token opening each block -> [..., block_size, H]: the target's embedding of
        [first, MASK x (block_size - 1)] times the input scale."""
        cfg = self.config
        block = first.new_full((*first.shape, cfg.block_size), cfg.mask_token_id)
        block[..., 0] = first
        embedded = target.embed_tokens(block)
        # x * 1.0 is x: skip the pass (a kernel per round on the GPU) for the usual scale.
        return embedded if cfg.input_embedding_scale == 1.0 else embedded * cfg.input_embedding_scale

    def context_kv(self, features: torch.Tensor, positions: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Per layer, the K/V of context tokens: features [B, C, K*H] at positions [B, C] -> [B, Hkv, C, D] each.

        They depend only on the committed tokens (not on the block), hence cacheable per slot."""
        context = self.hidden_norm(self.fc(features.to(self.fc.weight.dtype)))
        cos, sin = self.rotary(positions, context.dtype)
        return [layer.self_attn.project_kv(context, cos, sin) for layer in self.layers]

    def add_context(self, features: torch.Tensor, positions: torch.Tensor, cache: KVCache, rows: torch.Tensor) -> None:
        """Write the context K/V of committed tokens (features [B, C, K*H]) into cache rows [B, C]."""
        for i, (k, v) in enumerate(self.context_kv(features, positions)):
            cache.write(i, k, v, rows)

    def forward(self, block_embeddings: torch.Tensor, positions: torch.Tensor, cache: KVCache | PrefixKV,
                rows: torch.Tensor | None, mask: torch.Tensor) -> torch.Tensor:
        """block_embeddings: [B, T, H] (`embed_block`, one or more blocks flattened); positions: [B, T].

        The mask [B, T, L] says which context keys and block tokens each block token sees (its whole
        block: bidirectional). Returns the final-normed hidden states [B, T, H].
        """
        cos, sin = self.rotary(positions, block_embeddings.dtype)
        return run_layers(self.layers, self.norm, block_embeddings, cos, sin, cache, rows, mask)[0]

    def draft(self, target: Transformer, bonus: torch.Tensor, seq_lens: torch.Tensor, cache: KVCache,
              layout, depths: int | None = None, head: torch.Tensor | None = None) -> torch.Tensor:
        """One pass over [bonus, MASK...] after every slot's cached context -> logits [S, depths, V].

        bonus, seq_lens: [S]; layout(seq_lens, new_mask) -> (cache rows, attention mask) of the block
        (`Speculator.layout`: capacity-wide, so the shapes never depend on the contexts' lengths).
        depths: logits for depths 1..depths only (default: the whole block, block_size - 1); the block
        is still run whole (its positions attend to each other), only the lm_head is spared.
        head: the lm_head rows of a draft vocabulary ([N, H], `DraftVocab`): logits [S, depths, N] over
        those tokens only (default: the target's whole lm_head).
        """
        size = self.config.block_size
        offsets = torch.arange(size, device=bonus.device)
        bidirectional = torch.ones(bonus.shape[0], size, size, dtype=torch.bool, device=bonus.device)
        rows, mask = layout(seq_lens, bidirectional)
        hidden = self(self.embed_block(target, bonus), seq_lens[:, None] + offsets, cache, rows, mask)
        return self.logits(hidden[:, 1:1 + (depths or size - 1)], target.output_weight if head is None else head)

    def logits(self, hidden: torch.Tensor, output_weight: torch.Tensor) -> torch.Tensor:
        """The target's lm_head over drafter hidden states [..., H] -> logits [..., V]: in the weights' dtype
        (the draft's log-softmax reads them as they are), float32 where a multiplier or soft cap applies."""
        logits = linear(hidden, output_weight)
        if self.config.output_multiplier != 1.0:  # x * 1.0 is x: no pass over [..., V] for nothing
            logits = logits.float() * self.config.output_multiplier
        cap = self.config.final_logit_softcapping
        return torch.tanh(logits.float() / cap) * cap if cap else logits


DRAFT_VOCAB_FILE = "draft_vocab.json"


@dataclass(frozen=True)
class DraftVocab:
    """The tokens a drafter may propose, when its directory ships `draft_vocab.json`.

    The drafter's lm_head then runs over these rows of the target's lm_head only (on a CPU the full
    head is most of a draft's cost: a vocabulary-wide weight read per round), and its distribution
    is renormalised over them. Verification is untouched, so output stays exactly the target's; a
    token outside the set can only be emitted by the target itself (as the round's bonus token),
    never drafted. The file: {"token_ids": [...], "note": "..."}, ids distinct, in the target's vocabulary.
    """

    token_ids: tuple[int, ...]

    @staticmethod
    def load(directory: str | Path) -> "DraftVocab | None":
        path = Path(directory) / DRAFT_VOCAB_FILE
        if not path.is_file():
            return None
        try:
            ids = json.loads(path.read_text(encoding="utf-8"))["token_ids"]
        except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError) as e:
            raise ValueError(f"{path}: malformed draft vocabulary ({e!r}); expected {{\"token_ids\": [...]}}") from None
        if (not isinstance(ids, list) or not ids or not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0
                                                             for i in ids) or len(set(ids)) != len(ids)):
            raise ValueError(f"{path}: token_ids must be a non-empty list of distinct non-negative integers")
        return DraftVocab(tuple(ids))

    def save(self, directory: str | Path, note: str = "") -> Path:
        path = Path(directory) / DRAFT_VOCAB_FILE
        path.write_text(json.dumps({"note": note, "token_ids": list(self.token_ids)}))
        return path

    def check_target(self, vocab_size: int) -> None:
        if max(self.token_ids) >= vocab_size:
            raise ValueError(f"the draft vocabulary has token id {max(self.token_ids)}, outside the target's "
                             f"vocabulary [0, {vocab_size})")

    @staticmethod
    def most_frequent(sequences, size: int) -> "DraftVocab":
        """The `size` most frequent tokens of `sequences` (ties: lower id first), in id order."""
        from collections import Counter

        counts = Counter(t for seq in sequences for t in seq)
        ranked = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:size]
        return DraftVocab(tuple(sorted(t for t, _ in ranked)))


def save_drafter(drafter: DFlashDrafter, path: str | Path, dtype: torch.dtype | None = None,
                 max_shard_bytes: int | None = None) -> Path:
    """Write config.json + safetensors weights (in `dtype`, default as they are).

    With `max_shard_bytes`, weights are split into model-0000i-of-0000n.safetensors files of at
    most that size (a single tensor larger than it gets a file of its own) plus the HF index.
    """
    from safetensors.torch import save_file

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    for stale in [*path.glob("model*.safetensors"), path / "model.safetensors.index.json"]:
        stale.unlink(missing_ok=True)
    (path / "config.json").write_text(json.dumps(drafter.config.to_hf(), indent=2))
    tensors = {name: p.detach().to(dtype or p.dtype).contiguous().cpu() for name, p in drafter.named_parameters()}
    shards: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for name, t in tensors.items():
        nbytes = t.numel() * t.element_size()
        if max_shard_bytes and shards[-1] and size + nbytes > max_shard_bytes:
            shards.append({})
            size = 0
        shards[-1][name] = t
        size += nbytes
    if len(shards) == 1:
        save_file(shards[0], str(path / "model.safetensors"))
        return path
    weight_map = {}
    for i, shard in enumerate(shards, 1):
        name = f"model-{i:05d}-of-{len(shards):05d}.safetensors"
        save_file(shard, str(path / name))
        weight_map.update(dict.fromkeys(shard, name))
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (path / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    return path
