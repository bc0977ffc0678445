"""Typed, frozen configuration of a target decoder, read from a Hugging Face `config.json`.

One decoder implementation (models/transformer.py) covers the architectures below; everything that
differs between them is a field here, so the model code never branches on an architecture name.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# HF architecture name -> family. The family decides the per-architecture defaults read below.
SUPPORTED_ARCHITECTURES = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "llama",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
}


class UnsupportedModelError(ValueError):
    """The checkpoint describes a model this engine cannot run exactly."""


def unsupported_architecture(name: str, why: str = "") -> UnsupportedModelError:
    supported = ", ".join(sorted(SUPPORTED_ARCHITECTURES))
    return UnsupportedModelError(
        f"unsupported architecture {name!r}{why}: treeflash runs dense decoder-only transformers "
        f"({supported}); MoE, Mamba/hybrid and other architectures are not supported"
    )


# Markers of layers that carry a recurrent state instead of (or beside) a KV cache.
_RECURRENT_MARKERS = ("mamba", "ssm", "linear_attention", "deltanet", "recurrent", "conv")


def _recurrent_reason(arch: str, cfg: dict[str, Any]) -> str | None:
    layer_types = [str(t).lower() for t in cfg.get("layer_types") or []]
    keys = " ".join(cfg).lower()
    if (any(m in arch.lower() for m in ("mamba", "jamba", "zamba", "rwkv", "next", "hybrid", "recurrent"))
            or any(m in t for t in layer_types for m in _RECURRENT_MARKERS)
            or any(m in keys for m in ("mamba_", "ssm_", "linear_num_value_heads", "time_step"))):
        return (" (hybrid/recurrent layers: verifying a draft tree in one pass would need a separate recurrent "
                "state per tree node, which a KV cache cannot give; refused rather than risk wrong tokens)")
    return None


@dataclass(frozen=True)
class RopeConfig:
    theta: float = 10000.0
    kind: str = "default"  # "default", "linear" or "llama3"
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192

    @staticmethod
    def from_hf(cfg: dict[str, Any]) -> "RopeConfig":
        # transformers < 5 writes rope_theta + rope_scaling; transformers >= 5 writes rope_parameters.
        params = dict(cfg.get("rope_parameters") or {})
        scaling = cfg.get("rope_scaling") or {}
        params = {**scaling, **params}
        theta = float(params.get("rope_theta", cfg.get("rope_theta", 10000.0)))
        kind = params.get("rope_type", params.get("type", "default")) or "default"
        if kind not in ("default", "linear", "llama3"):
            raise UnsupportedModelError(
                f"unsupported rope scaling {kind!r}: supported are default, linear and llama3"
            )
        return RopeConfig(
            theta=theta,
            kind=kind,
            factor=float(params.get("factor", 1.0)),
            low_freq_factor=float(params.get("low_freq_factor", 1.0)),
            high_freq_factor=float(params.get("high_freq_factor", 4.0)),
            original_max_position_embeddings=int(params.get("original_max_position_embeddings", 8192)),
        )


@dataclass(frozen=True)
class ModelConfig:
    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope: RopeConfig = field(default_factory=RopeConfig)
    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False
    qk_norm: bool = False
    tie_word_embeddings: bool = False
    max_position_embeddings: int = 2048
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()

    @staticmethod
    def from_hf(cfg: dict[str, Any]) -> "ModelConfig":
        archs = cfg.get("architectures") or []
        if not archs and cfg.get("model_type") in ("llama", "qwen2", "qwen3", "mistral"):
            archs = [{"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM",
                      "qwen3": "Qwen3ForCausalLM", "mistral": "MistralForCausalLM"}[cfg["model_type"]]]
        if not archs:
            raise UnsupportedModelError("config.json names no architecture ('architectures' is missing)")
        arch = archs[0]
        family = SUPPORTED_ARCHITECTURES.get(arch)
        recurrent = _recurrent_reason(arch, cfg)
        if family is None or recurrent:
            raise unsupported_architecture(arch, recurrent or "")
        if cfg.get("num_local_experts") or cfg.get("num_experts"):
            raise unsupported_architecture(f"{arch} with experts (MoE)")
        if cfg.get("use_sliding_window") or (family == "llama" and cfg.get("sliding_window")):
            raise UnsupportedModelError(f"{arch} with sliding-window attention is not supported")
        layer_types = cfg.get("layer_types")
        if layer_types and any(t != "full_attention" for t in layer_types):
            raise UnsupportedModelError(
                f"{arch} with layer types {sorted(set(layer_types))}: only full attention is supported"
            )
        if cfg.get("hidden_act", "silu") != "silu":
            raise UnsupportedModelError(f"hidden_act {cfg.get('hidden_act')!r} is not supported (only silu)")
        heads = int(cfg["num_attention_heads"])
        hidden = int(cfg["hidden_size"])
        eos = cfg.get("eos_token_id")
        eos_ids = tuple(eos) if isinstance(eos, list) else (() if eos is None else (int(eos),))
        return ModelConfig(
            architecture=arch,
            vocab_size=int(cfg["vocab_size"]),
            hidden_size=hidden,
            intermediate_size=int(cfg["intermediate_size"]),
            num_layers=int(cfg["num_hidden_layers"]),
            num_heads=heads,
            num_kv_heads=int(cfg.get("num_key_value_heads") or heads),
            head_dim=int(cfg.get("head_dim") or hidden // heads),
            rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
            rope=RopeConfig.from_hf(cfg),
            qkv_bias=True if family == "qwen2" else bool(cfg.get("attention_bias", False)),
            o_bias=False if family == "qwen2" else bool(cfg.get("attention_bias", False)),
            mlp_bias=bool(cfg.get("mlp_bias", False)),
            qk_norm=family == "qwen3",
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            max_position_embeddings=int(cfg.get("max_position_embeddings", 2048)),
            bos_token_id=cfg.get("bos_token_id"),
            eos_token_ids=eos_ids,
        )

    @staticmethod
    def from_dir(path: str | Path) -> "ModelConfig":
        return ModelConfig.from_hf(read_config_json(path))


def read_config_json(path: str | Path) -> dict[str, Any]:
    file = Path(path) / "config.json"
    if not file.is_file():
        raise FileNotFoundError(f"{path}: no config.json (expected a Hugging Face model directory)")
    try:
        return json.loads(file.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{file}: malformed config.json: {e}") from None
