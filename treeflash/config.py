"""Typed, frozen configuration of a target decoder, read from a Hugging Face `config.json`.

One decoder implementation (models/transformer.py) covers the architectures below; everything that
differs between them is a field here, so the model code never branches on an architecture name.
"""

from __future__ import annotations

import json
import math
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, TypeVar

T = TypeVar("T")

# HF architecture name -> family. The family decides the per-architecture defaults read below.
SUPPORTED_ARCHITECTURES = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "llama",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
    "Qwen2MoeForCausalLM": "qwen2",
    "Qwen3MoeForCausalLM": "qwen3",
    "MixtralForCausalLM": "llama",
    "GptOssForCausalLM": "gpt_oss",
    "SmolLM3ForCausalLM": "smollm3",
    "Phi3ForCausalLM": "phi3",
    "Gemma3ForCausalLM": "gemma3",
    "Gemma3ForConditionalGeneration": "gemma3",  # (its text decoder alone: text in, text out)
}
# Those whose MLPs are mixtures of experts (`ExpertsConfig`); any other with experts is refused.
MIXTURE_ARCHITECTURES = ("Qwen2MoeForCausalLM", "Qwen3MoeForCausalLM", "MixtralForCausalLM", "GptOssForCausalLM")


class UnsupportedModelError(ValueError):
    """The checkpoint describes a model this engine cannot run exactly."""


class ConfigError(ValueError):
    """config.json lacks a key the model needs, or a key holds a value of the wrong type."""


_REQUIRED = object()
_TYPE_NAMES = {int: "an integer", float: "a number", bool: "true or false", str: "a string", list: "a list",
               dict: "an object"}


def config_value(cfg: dict[str, Any], key: str, kind: type, default: Any = _REQUIRED, *, minimum: float | None = None,
                 where: str = "config.json") -> Any:
    """`cfg[key]` checked to be a `kind` (int, float, bool, str, list or dict), else a ConfigError naming the key.

    A key that is absent or null takes `default`; without a default it is required. Booleans are not
    integers here (JSON `true` is no head count), and an integer is a valid float.
    """
    value = cfg.get(key)
    if value is None:
        if default is _REQUIRED:
            raise ConfigError(f"{where}: required key {key!r} is missing")
        return default
    ok = isinstance(value, kind) and not (kind in (int, float) and isinstance(value, bool))
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        ok, value = True, float(value)
    if not ok:
        raise ConfigError(f"{where}: {key!r} must be {_TYPE_NAMES[kind]}, got {value!r}")
    if minimum is not None and value < minimum:
        raise ConfigError(f"{where}: {key!r} must be at least {minimum}, got {value!r}")
    return value


def config_int_list(cfg: dict[str, Any], key: str, *, where: str = "config.json") -> tuple[int, ...]:
    """An optional key holding one integer or a list of integers (e.g. eos_token_id), as a tuple."""
    value = cfg.get(key)
    items = value if isinstance(value, list) else [] if value is None else [value]
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in items):
        raise ConfigError(f"{where}: {key!r} must be an integer or a list of integers, got {value!r}")
    return tuple(items)


def unsupported_architecture(name: str, why: str = "") -> UnsupportedModelError:
    supported = ", ".join(sorted(SUPPORTED_ARCHITECTURES))
    return UnsupportedModelError(
        f"unsupported architecture {name!r}{why}: treeflash runs decoder-only transformers "
        f"({supported}); other mixtures of experts, Mamba/hybrid and other architectures are not supported"
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
    kind: str = "default"  # "default", "linear", "llama3", "yarn" or "longrope" (Phi-3's; its short factors)
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192
    # YaRN (models/layers.py: yarn_inv_freq): the ramp's bounds in rotations, and the cos/sin scale
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    attention_factor: float = 1.0
    truncate: bool = True
    # LongRoPE (Phi-3): a divisor per frequency for sequences of at most original_max_position_embeddings tokens
    # (the short factors, used here) and one for longer ones (kept for to_hf, never used: models/layers.py)
    short_factor: tuple[float, ...] = ()
    long_factor: tuple[float, ...] = ()
    partial: float = 1.0  # the share of each head's dimensions rotated (Phi-4-mini: 0.75; the rest pass through)

    @staticmethod
    def from_hf(cfg: dict[str, Any], default_theta: float = 10000.0, phi3: bool = False) -> "RopeConfig":
        # transformers < 5 writes rope_theta + rope_scaling; transformers >= 5 writes rope_parameters. A file
        # with both (a v5 config with rope_scaling added as a model card says) is read as transformers 5 reads
        # it: rope_scaling alone, with its theta or the top-level rope_theta.
        params = config_value(cfg, "rope_parameters", dict, {})
        scaling = config_value(cfg, "rope_scaling", dict, {})
        if not scaling:
            return RopeConfig._of(params, cfg, default_theta, phi3)
        rope = RopeConfig._of(scaling, cfg, default_theta, phi3)
        try:
            same = not params or RopeConfig._of(params, cfg, default_theta, phi3) == rope
        except (UnsupportedModelError, ValueError):
            same = False
        if not same:
            warnings.warn(f"config.json has both rope_scaling {scaling} and rope_parameters {params}; as "
                          f"transformers does, rope_scaling is used and rope_parameters ignored", stacklevel=2)
        return rope

    @staticmethod
    def _of(params: dict[str, Any], cfg: dict[str, Any], default_theta: float, phi3: bool) -> "RopeConfig":
        where = "config.json rope parameters"
        theta = config_value(params, "rope_theta", float, config_value(cfg, "rope_theta", float, default_theta),
                             where=where)
        # "type": the older name of "rope_type"
        kind = config_value(params, "rope_type", str, config_value(params, "type", str, "default", where=where),
                            where=where)
        if phi3:
            return RopeConfig._phi3(params, cfg, theta, kind, where)
        if kind not in ("default", "linear", "llama3", "yarn"):
            raise UnsupportedModelError(
                f"unsupported rope scaling {kind!r}: supported are default, linear, llama3 and yarn"
                + (" (and Phi-3's longrope)" if kind in ("longrope", "su") else "")
            )
        # Read as transformers (5.x) reads them: the scaled kinds need their factors (it fails without them,
        # and a default here would run another RoPE than the one meant); llama3's pre-training context is
        # the rope parameters' original_max_position_embeddings, else max_position_embeddings (a top-level
        # original_max_position_embeddings is set after transformers' Llama/Qwen configs read their RoPE).
        required = {"linear": ("factor",), "llama3": ("factor", "low_freq_factor", "high_freq_factor"),
                    "yarn": ("factor",)}.get(kind, ())
        absent = [k for k in required if params.get(k) is None]
        if absent:
            raise ConfigError(f"{where}: rope_type {kind!r} needs {', '.join(absent)}")
        max_positions = config_value(cfg, "max_position_embeddings", int, 2048)
        original = config_value(params, "original_max_position_embeddings", int, max_positions, minimum=1,
                                where=where)
        factor = config_value(params, "factor", float, 1.0, where=where)
        return RopeConfig(
            theta=theta,
            kind=kind,
            factor=factor,
            low_freq_factor=config_value(params, "low_freq_factor", float, 1.0, where=where),
            high_freq_factor=config_value(params, "high_freq_factor", float, 4.0, where=where),
            original_max_position_embeddings=original,
            **(RopeConfig._yarn(params, factor, where) if kind == "yarn" else {}),
        )

    @staticmethod
    def _phi3(params: dict[str, Any], cfg: dict[str, Any], theta: float, kind: str, where: str) -> "RopeConfig":
        """Phi-3's RoPE, as transformers' Phi3Config reads it: "su" and "yarn" are older names of longrope; the
        rotated share `partial_rotary_factor` (the rope parameters', else config.json's, else all); LongRoPE's
        pre-training context is config.json's original_max_position_embeddings (4,096 where absent), and its
        cos/sin scale the given attention_factor, else sqrt(1 + ln(factor) / ln(that context)) with factor
        max_position_embeddings / that context where not given."""
        kind = "longrope" if kind in ("su", "yarn") else kind
        if kind not in ("default", "longrope"):
            raise UnsupportedModelError(f"unsupported rope scaling {kind!r} for Phi3ForCausalLM: supported are "
                                        f"default and longrope")
        partial = config_value(params, "partial_rotary_factor", float,
                               config_value(cfg, "partial_rotary_factor", float, 1.0), where=where)
        heads = config_value(cfg, "num_attention_heads", int, minimum=1)
        head_dim = config_value(cfg, "head_dim", int, None) or config_value(cfg, "hidden_size", int, minimum=1) // heads
        rotated = int(head_dim * partial)
        if not 0 < partial <= 1 or rotated < 2 or rotated % 2:
            raise ConfigError(f"{where}: partial_rotary_factor {partial} rotates {rotated} of a head's {head_dim} "
                              f"dimensions; rotary embeddings rotate a positive, even number of them")
        if kind == "default":
            return RopeConfig(theta=theta, partial=partial)
        original = config_value(cfg, "original_max_position_embeddings", int, 4096, minimum=2)
        factors = {}
        for key in ("short_factor", "long_factor"):
            value = params.get(key)
            if (not isinstance(value, list) or len(value) != rotated // 2
                    or not all(isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0 for v in value)):
                raise ConfigError(f"{where}: longrope's {key} must be a list of {rotated // 2} positive numbers (one "
                                  f"per rotated frequency), got {value!r}")
            factors[key] = tuple(float(v) for v in value)
        given = config_value(params, "attention_factor", float, None, where=where)
        factor = config_value(params, "factor", float, None, where=where) or (
            config_value(cfg, "max_position_embeddings", int, 4096) / original)
        scale = given if given is not None else (
            1.0 if factor <= 1 else math.sqrt(1 + math.log(factor) / math.log(original)))
        return RopeConfig(theta=theta, kind="longrope", factor=factor, original_max_position_embeddings=original,
                          attention_factor=float(scale), partial=partial, **factors)

    def to_hf(self) -> dict[str, Any]:
        """This RoPE as transformers 5's `rope_parameters` says it, every scaling field kept (a drafter's
        config.json that said "default" whatever it ran would run another RoPE once read back)."""
        params: dict[str, Any] = {"rope_theta": self.theta, "rope_type": self.kind}
        if self.kind != "default":
            params["factor"] = self.factor
        if self.kind in ("llama3", "yarn"):
            params["original_max_position_embeddings"] = self.original_max_position_embeddings
        if self.kind == "llama3":
            params |= {"low_freq_factor": self.low_freq_factor, "high_freq_factor": self.high_freq_factor}
        if self.kind == "yarn":
            params |= {"beta_fast": self.beta_fast, "beta_slow": self.beta_slow,
                       "attention_factor": self.attention_factor, "truncate": self.truncate}
        if self.kind == "longrope":
            params |= {"original_max_position_embeddings": self.original_max_position_embeddings,
                       "attention_factor": self.attention_factor, "short_factor": list(self.short_factor),
                       "long_factor": list(self.long_factor)}
        if self.partial != 1.0:
            params["partial_rotary_factor"] = self.partial
        return params

    @staticmethod
    def _yarn(params: dict[str, Any], factor: float, where: str) -> dict[str, Any]:
        """YaRN's fields, as transformers (5.x) reads them: beta_fast / beta_slow 32 / 1 where absent (or 0), the
        cos/sin scale given, else 0.1 ln(factor) + 1 (with DeepSeek's mscale / mscale_all_dim, their ratio)."""
        def mscale(scale: float, m: float = 1.0) -> float:
            return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

        given = config_value(params, "attention_factor", float, None, where=where)
        m, m_all = (config_value(params, k, float, None, where=where) for k in ("mscale", "mscale_all_dim"))
        if given is None:
            given = mscale(factor, m) / mscale(factor, m_all) if m and m_all else mscale(factor)
        return {"beta_fast": config_value(params, "beta_fast", float, None, where=where) or 32.0,
                "beta_slow": config_value(params, "beta_slow", float, None, where=where) or 1.0,
                "attention_factor": float(given),
                "truncate": config_value(params, "truncate", bool, True, where=where)}


@dataclass(frozen=True)
class Fp8Weights:
    """A checkpoint whose linear weights are 8-bit floats (e4m3 or e5m2), each with float32 scales beside it, in
    one of the formats FP8 releases use: `quant_method` "fp8" with a `weight_block_size` (Qwen's and DeepSeek's:
    `X.weight_scale_inv`, one scale per block of [rows, columns], the grid's last blocks cut short where a
    dimension is not a multiple) or without one (AutoFP8's: `X.weight_scale`, one a tensor), or
    "compressed-tensors" with 8-bit float weights (llm-compressor's: `X.weight_scale`, one a tensor, an output row
    or a block). Loading multiplies them out into the engine's dtype (checkpoint.py: `dequantize_fp8`), in
    float32, rounded once: the numbers transformers makes of a block-scaled checkpoint without an FP8-capable
    GPU. Activations stay in that dtype, not quantised to 8 bits as an FP8 kernel would."""

    block: tuple[int, int] | None = (128, 128)  # None: one scale a tensor or a row, as the scale's shape says
    scale_names: tuple[str, ...] = ("weight_scale_inv", "weight_scale")  # X.weight's is the first beside it

    @staticmethod
    def from_hf(quantization: dict[str, Any]) -> "Fp8Weights":
        block = _block_size(quantization.get("weight_block_size"), "weight_block_size")
        fmt = quantization.get("fmt", "e4m3")
        if fmt not in ("e4m3", "e5m2"):
            raise UnsupportedModelError(f"quantization_config.fmt {fmt!r} is not an 8-bit float format this engine "
                                        f"reads (e4m3, e5m2)")
        return Fp8Weights(block)

    @staticmethod
    def from_compressed_tensors(quantization: dict[str, Any]) -> "Fp8Weights":
        """compressed-tensors' FP8 weights (any activation scheme: activations are not quantised here); integer,
        packed, grouped or asymmetric weights are refused by name."""
        where = "quantization_config (compressed-tensors)"
        fmt = quantization.get("format")
        if fmt not in ("float-quantized", "naive-quantized"):
            raise UnsupportedModelError(f"{where}: format {fmt!r} is not supported; of compressed-tensors only 8-bit "
                                        f"float weights are read (float-quantized)")
        groups = quantization.get("config_groups")
        if not isinstance(groups, dict) or not groups:
            raise UnsupportedModelError(f"{where}: config_groups must name at least one group")
        schemes = set()
        for name, group in groups.items():
            weights = group.get("weights") if isinstance(group, dict) else None
            if not isinstance(weights, dict):
                raise UnsupportedModelError(f"{where}: group {name!r} quantises no weights")
            kind = (weights.get("type"), weights.get("num_bits"), weights.get("symmetric", True))
            if kind != ("float", 8, True):
                raise UnsupportedModelError(f"{where}: group {name!r} stores {weights.get('num_bits')}-bit "
                                            f"{weights.get('type')} weights (symmetric: {weights.get('symmetric')}); "
                                            f"only symmetric 8-bit float weights are read")
            strategy = weights.get("strategy")
            if strategy not in ("tensor", "channel", "block"):
                raise UnsupportedModelError(f"{where}: group {name!r} has weight strategy {strategy!r}; tensor, "
                                            f"channel and block are read")
            block = _block_size(weights.get("block_structure"), "block_structure") if strategy == "block" else None
            if strategy == "block" and block is None:
                raise UnsupportedModelError(f"{where}: group {name!r} has the block strategy and no block_structure")
            schemes.add((strategy, block))
        if len(schemes) > 1:
            raise UnsupportedModelError(f"{where}: the groups quantise weights in different ways ({sorted(schemes)}); "
                                        f"one scheme for every group is read")
        return Fp8Weights(block=schemes.pop()[1], scale_names=("weight_scale",))


def _block_size(block, key: str) -> tuple[int, int] | None:
    if block is not None and (not isinstance(block, (list, tuple)) or len(block) != 2 or not all(
            isinstance(b, int) and not isinstance(b, bool) and b >= 1 for b in block)):
        raise UnsupportedModelError(f"quantization_config {key} must be two positive integers (rows, columns) or "
                                    f"null, got {block!r}")
    return None if block is None else (block[0], block[1])


@dataclass(frozen=True)
class ExpertsConfig:
    """Mixture-of-experts MLPs (Qwen3-MoE, Qwen2-MoE, Mixtral, GPT-OSS; models/layers.py: `SparseMoE`): a router's
    softmax picks each token's `per_token` experts of `count`, whose MLP outputs are summed with those weights."""

    count: int
    per_token: int
    intermediate_size: int  # each expert's MLP width
    normalize: bool  # the chosen experts' weights rescaled to sum to 1 (norm_topk_prob)
    sparse_layers: tuple[int, ...]  # layers whose MLP is the experts; the others are dense (intermediate_size)
    shared_intermediate_size: int = 0  # Qwen2-MoE: an MLP every token runs, scaled by a sigmoid gate
    # GPT-OSS: the router and every expert projection carry a bias, and an expert's activation is its clamped
    # SwiGLU, (clamp(up, -limit, limit) + 1) * g * sigmoid(1.702 g) for g = min(gate, limit), not silu(gate) * up.
    bias: bool = False
    swiglu_limit: float | None = None

    @staticmethod
    def from_hf(cfg: dict[str, Any], num_layers: int, arch: str = "Qwen3MoeForCausalLM") -> "ExpertsConfig":
        every_layer = arch in ("MixtralForCausalLM", "GptOssForCausalLM")  # (both name num_local_experts)
        if every_layer:
            count = config_value(cfg, "num_local_experts", int, minimum=1)
        else:  # (transformers 5 writes num_local_experts; the hub's checkpoints num_experts)
            count = config_value(cfg, "num_experts", int,
                                 config_value(cfg, "num_local_experts", int, None, minimum=1), minimum=1)
            if count is None:
                raise ConfigError("config.json: required key 'num_experts' is missing")
        per_token = config_value(cfg, "num_experts_per_tok", int, minimum=1)
        if per_token > count:
            raise ConfigError(f"config.json: num_experts_per_tok {per_token} exceeds the {count} experts")
        if every_layer:
            # Every layer sparse, experts as wide as intermediate_size, the chosen weights always rescaled
            # (transformers' MixtralTopKRouter; GPT-OSS's softmax over its top k logits is the whole softmax's top
            # k rescaled); no shared expert. GPT-OSS: biases and its clamped SwiGLU, whose limit transformers
            # keeps at 7 whatever config.json says.
            gpt_oss = arch == "GptOssForCausalLM"
            limit = config_value(cfg, "swiglu_limit", float, 7.0) if gpt_oss else None
            if gpt_oss and limit != 7.0:
                raise UnsupportedModelError(f"GptOssForCausalLM with swiglu_limit {limit}: transformers runs 7.0 "
                                            f"whatever config.json says, so which one the weights want is unknown")
            return ExpertsConfig(count=count, per_token=per_token,
                                 intermediate_size=config_value(cfg, "intermediate_size", int, minimum=1),
                                 normalize=True, sparse_layers=tuple(range(num_layers)), bias=gpt_oss,
                                 swiglu_limit=limit)
        step = config_value(cfg, "decoder_sparse_step", int, 1, minimum=1)
        dense = config_value(cfg, "mlp_only_layers", list, [])
        return ExpertsConfig(
            count=count,
            per_token=per_token,
            intermediate_size=config_value(cfg, "moe_intermediate_size", int, minimum=1),
            normalize=config_value(cfg, "norm_topk_prob", bool, False),
            sparse_layers=tuple(i for i in range(num_layers) if i not in dense and (i + 1) % step == 0),
            shared_intermediate_size=config_value(cfg, "shared_expert_intermediate_size", int, 0, minimum=0),
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
    experts: ExpertsConfig | None = None  # None: every layer's MLP is dense
    sliding_window: int | None = None  # the window of the layers in window_layers (`window`)
    window_layers: tuple[int, ...] = ()
    attention_sinks: bool = False  # GPT-OSS: a learnt logit per query head that every softmax's sum includes
    nope_layers: tuple[int, ...] = ()  # SmolLM3: layers whose queries and keys are not rotated (no position code)
    # Gemma 3: norms that scale by (1 + weight) in float32 before the cast back; the attention's and the MLP's
    # outputs normed before their residual sums; the embedding times sqrt(hidden_size) (rounded to its dtype);
    # a tanh-approximated GELU gate; the sliding layers' own RoPE (a base of 10,000 against the others' 1,000,000),
    # theirs even where their window covers the whole context
    norm_offset: bool = False
    sandwich_norms: bool = False
    embed_scale: float | None = None
    activation: str = "silu"  # or "gelu_tanh"
    local_rope: RopeConfig | None = None
    local_rope_layers: tuple[int, ...] = ()
    fp8: Fp8Weights | None = None  # linear weights stored as 8-bit floats and scales (multiplied out at load)

    @staticmethod
    def from_hf(cfg: dict[str, Any]) -> "ModelConfig":
        arch = _architecture(cfg)
        family = SUPPORTED_ARCHITECTURES.get(arch)
        recurrent = _recurrent_reason(arch, cfg)
        if family is None or recurrent:
            multimodal = " (a multimodal checkpoint; its text decoder alone is not read)" if arch.endswith(
                "ForConditionalGeneration") else ""
            raise unsupported_architecture(arch, recurrent or multimodal)
        if family == "gemma3":
            cfg = _gemma3_text_config(cfg, arch)
        mixture = arch in MIXTURE_ARCHITECTURES
        if not mixture and (cfg.get("num_local_experts") or cfg.get("num_experts")):
            raise unsupported_architecture(f"{arch} with experts (MoE)")
        quantization = cfg.get("quantization_config")
        # (OpenAI's GPT-OSS checkpoints keep their experts in MXFP4, which loading turns into bfloat16 exactly:
        # checkpoint.py: dequantize_mxfp4)
        method = quantization.get("quant_method", "?") if isinstance(quantization, dict) else quantization
        mxfp4 = family == "gpt_oss" and method == "mxfp4"
        fp8 = None
        if isinstance(quantization, dict) and method == "fp8":
            fp8 = Fp8Weights.from_hf(quantization)
        elif isinstance(quantization, dict) and method == "compressed-tensors":
            fp8 = Fp8Weights.from_compressed_tensors(quantization)
        if quantization is not None and not mxfp4 and fp8 is None:  # codes and scales: as floats, other numbers
            raise UnsupportedModelError(f"quantised checkpoints are not supported (quantization_config: {method}); "
                                        f"use an unquantised one (float32, float16 or bfloat16), an FP8 one "
                                        f"(quant_method fp8, or compressed-tensors' 8-bit float weights) or a GGUF "
                                        f"file")
        max_positions = config_value(cfg, "max_position_embeddings", int, _MAX_POSITIONS[arch], minimum=2)
        gemma = family == "gemma3"
        if gemma:
            rope, window_rope = _gemma3_ropes(cfg)
        else:
            rope, window_rope = RopeConfig.from_hf(cfg, _DEFAULT_THETA.get(arch, 10000.0), phi3=family == "phi3"), None
        if rope.kind == "longrope" and max_positions > rope.original_max_position_embeddings:
            # Past that many tokens transformers switches to the long factors and computes the whole cache
            # again (Phi3ForCausalLM.prepare_inputs_for_generation): positions already cached would change.
            warnings.warn(f"{arch}: LongRoPE's long factors are not supported; the context is limited to its "
                          f"short factors' {rope.original_max_position_embeddings} positions (of "
                          f"max_position_embeddings {max_positions})", stacklevel=2)
            max_positions = rope.original_max_position_embeddings
        # (Gemma 3 names its activation hidden_activation)
        act_key = "hidden_activation" if gemma else "hidden_act"
        hidden_act = config_value(cfg, act_key, str, "gelu_pytorch_tanh" if gemma else "silu")
        activation = {"silu": "silu", "gelu_pytorch_tanh": "gelu_tanh"}.get(hidden_act)
        if activation is None or (activation != "silu" and not gemma):
            raise UnsupportedModelError(f"{act_key} {hidden_act!r} is not supported (only silu"
                                        + (" and gelu_pytorch_tanh)" if gemma else ")"))
        heads = config_value(cfg, "num_attention_heads", int, minimum=1)
        hidden = config_value(cfg, "hidden_size", int, minimum=1)
        head_dim = config_value(cfg, "head_dim", int, 256 if gemma else None, minimum=1)
        if gemma:
            _check_gemma3(cfg, head_dim)
        if head_dim is None and hidden % heads:
            raise ConfigError(f"config.json: hidden_size {hidden} is not a multiple of num_attention_heads {heads} "
                              f"and no 'head_dim' is given")
        if (head_dim or hidden // heads) % 2:
            raise ConfigError(f"config.json: the head dimension {head_dim or hidden // heads} is odd; rotary "
                              f"embeddings rotate pairs of dimensions")
        kv_heads = config_value(cfg, "num_key_value_heads", int, heads, minimum=1)
        if heads % kv_heads:
            raise ConfigError(f"config.json: num_attention_heads {heads} is not a multiple of num_key_value_heads "
                              f"{kv_heads} (each key/value head serves a whole group of query heads)")
        # (Phi-3's projections have no biases whatever config.json says)
        attention_bias = family != "phi3" and config_value(cfg, "attention_bias", bool, family == "gpt_oss")
        num_layers = config_value(cfg, "num_hidden_layers", int, minimum=1)
        window, window_layers = _sliding_windows(arch, family, cfg, num_layers, max_positions)
        # (Qwen2-MoE names its q/k/v bias; Qwen2 always has one)
        qkv_bias = config_value(cfg, "qkv_bias", bool, True) if arch == "Qwen2MoeForCausalLM" else True
        return ModelConfig(
            architecture=arch,
            vocab_size=config_value(cfg, "vocab_size", int, minimum=1),
            hidden_size=hidden,
            intermediate_size=config_value(cfg, "intermediate_size", int, minimum=1),
            num_layers=num_layers,
            num_heads=heads,
            num_kv_heads=kv_heads,
            head_dim=head_dim or hidden // heads,
            rms_norm_eps=config_value(cfg, "rms_norm_eps", float, 1e-5 if family == "phi3" else 1e-6),
            rope=rope,
            qkv_bias=qkv_bias if family == "qwen2" else attention_bias,
            o_bias=False if family == "qwen2" else attention_bias,
            mlp_bias=family != "phi3" and config_value(cfg, "mlp_bias", bool, False),
            qk_norm=family in ("qwen3", "gemma3"),
            tie_word_embeddings=config_value(cfg, "tie_word_embeddings", bool, gemma),
            max_position_embeddings=max_positions,
            bos_token_id=config_value(cfg, "bos_token_id", int, None),
            eos_token_ids=config_int_list(cfg, "eos_token_id"),
            experts=ExpertsConfig.from_hf(cfg, num_layers, arch) if mixture else None,
            sliding_window=window,
            window_layers=window_layers,
            attention_sinks=family == "gpt_oss",
            nope_layers=_nope_layers(cfg, num_layers) if family == "smollm3" else (),
            norm_offset=gemma,
            sandwich_norms=gemma,
            embed_scale=hidden ** 0.5 if gemma else None,
            activation=activation,
            local_rope=window_rope,
            local_rope_layers=_gemma3_sliding_layers(cfg, num_layers) if gemma else (),
            fp8=fp8,
        )

    def window(self, layer: int) -> int | None:
        """The sliding window of a layer's attention (each token sees itself and the window - 1 positions before
        it), None where it sees every position before it."""
        return self.sliding_window if layer in self.window_layers else None

    @staticmethod
    def from_dir(path: str | Path) -> "ModelConfig":
        return read_config(path, ModelConfig.from_hf)


_MODEL_TYPES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM",
                "mistral": "MistralForCausalLM", "qwen2_moe": "Qwen2MoeForCausalLM", "qwen3_moe": "Qwen3MoeForCausalLM",
                "mixtral": "MixtralForCausalLM", "gpt_oss": "GptOssForCausalLM", "smollm3": "SmolLM3ForCausalLM",
                "phi3": "Phi3ForCausalLM", "gemma3_text": "Gemma3ForCausalLM",
                "gemma3": "Gemma3ForConditionalGeneration"}
# transformers' defaults where config.json gives no max_position_embeddings.
_MAX_POSITIONS = {"LlamaForCausalLM": 2048, "MistralForCausalLM": 4096 * 32, "Qwen2ForCausalLM": 32768,
                  "Qwen3ForCausalLM": 32768, "Qwen2MoeForCausalLM": 32768, "Qwen3MoeForCausalLM": 32768,
                  "MixtralForCausalLM": 4096 * 32, "GptOssForCausalLM": 131072, "SmolLM3ForCausalLM": 32768,
                  "Phi3ForCausalLM": 4096, "Gemma3ForCausalLM": 131072,
                  "Gemma3ForConditionalGeneration": 131072}
# transformers' RoPE base where config.json gives none (10,000 for the others).
_DEFAULT_THETA = {"SmolLM3ForCausalLM": 2_000_000.0}


# transformers' Gemma3TextConfig defaults: the multimodal checkpoints' text_config gives only what differs from them
_GEMMA3_TEXT_DEFAULTS = {
    "vocab_size": 262_208, "hidden_size": 2304, "intermediate_size": 9216, "num_hidden_layers": 26,
    "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256, "max_position_embeddings": 131_072,
    "rms_norm_eps": 1e-6, "tie_word_embeddings": True, "query_pre_attn_scalar": 256, "sliding_window": 4096,
    "bos_token_id": 2, "eos_token_id": 1}


def _gemma3_text_config(cfg: dict[str, Any], arch: str) -> dict[str, Any]:
    """The config Gemma 3's text decoder is built from, its absent keys at transformers' defaults: config.json
    itself, or a multimodal checkpoint's text_config (with the top level's token ids where it has none)."""
    if arch == "Gemma3ForCausalLM":
        return {**_GEMMA3_TEXT_DEFAULTS, **cfg}
    text = cfg.get("text_config")
    if not isinstance(text, dict):
        raise ConfigError(f"config.json: {arch} needs a 'text_config' object, got {text!r}")
    ids = {k: cfg[k] for k in ("bos_token_id", "eos_token_id") if cfg.get(k) is not None}
    return {**_GEMMA3_TEXT_DEFAULTS, **ids, **text}


def _gemma3_ropes(cfg: dict[str, Any]) -> tuple[RopeConfig, RopeConfig]:
    """Gemma 3's two RoPEs, as transformers' Gemma3TextConfig reads them: the full-attention layers' from
    rope_parameters["full_attention"] (older files: rope_theta, 1,000,000 where absent, and rope_scaling), the
    window layers' from rope_parameters["sliding_attention"] (older files: rope_local_base_freq, 10,000)."""
    params = config_value(cfg, "rope_parameters", dict, {})
    per_type = bool(params) and set(params) <= {"full_attention", "sliding_attention"}
    full = dict(params.get("full_attention") or {}) if per_type else dict(params)
    local = dict(params.get("sliding_attention") or {}) if per_type else {}
    full.update(config_value(cfg, "rope_scaling", dict, {}))
    full.setdefault("rope_theta", config_value(cfg, "rope_theta", float, 1_000_000.0))
    local.setdefault("rope_theta", config_value(cfg, "rope_local_base_freq", float, 10_000.0))
    return RopeConfig._of(full, cfg, 1_000_000.0, False), RopeConfig._of(local, cfg, 10_000.0, False)


def _gemma3_sliding_layers(cfg: dict[str, Any], num_layers: int) -> tuple[int, ...]:
    """Gemma 3's sliding layers: those layer_types names so, else all but every sliding_window_pattern-th (6)."""
    layer_types = config_value(cfg, "layer_types", list, [])
    if layer_types:
        return tuple(i for i, t in enumerate(layer_types) if t == "sliding_attention")
    pattern = config_value(cfg, "sliding_window_pattern", int, 6, minimum=1)
    return tuple(i for i in range(num_layers) if (i + 1) % pattern)


def _check_gemma3(cfg: dict[str, Any], head_dim: int) -> None:
    """Refuse what Gemma 3's text decoder may set and this one does not run."""
    scalar = config_value(cfg, "query_pre_attn_scalar", float, 256.0)
    if scalar != head_dim:  # (Gemma 3 27B: 168 over heads of 128)
        raise UnsupportedModelError(f"Gemma 3 with query_pre_attn_scalar {scalar:g} over heads of "
                                    f"{head_dim}: only a score scale of 1/sqrt(head_dim) is supported")
    for key in ("attn_logit_softcapping", "final_logit_softcapping"):
        if cfg.get(key) is not None:
            raise UnsupportedModelError(f"Gemma 3 with {key} {cfg[key]!r} is not supported")
    if cfg.get("use_bidirectional_attention"):
        raise UnsupportedModelError("Gemma 3 with use_bidirectional_attention is not supported (an "
                                    "encoder's attention, not a decoder's)")


def _nope_layers(cfg: dict[str, Any], num_layers: int) -> tuple[int, ...]:
    """SmolLM3's layers without rotary embeddings, as transformers reads them: `no_rope_layers` holds a 1 for
    each layer that rotates and a 0 for each that does not (at least one entry a layer; extra ones unread);
    absent, every `no_rope_layer_interval`-th layer (4) goes without."""
    flags = config_value(cfg, "no_rope_layers", list, None)
    if flags is None:
        interval = config_value(cfg, "no_rope_layer_interval", int, 4, minimum=1)
        flags = [int((i + 1) % interval != 0) for i in range(num_layers)]
    if len(flags) < num_layers or any(f not in (0, 1) or isinstance(f, bool) for f in flags):
        raise ConfigError(f"config.json: 'no_rope_layers' must hold a 0 or 1 for each of the {num_layers} layers, "
                          f"got {flags!r}")
    return tuple(i for i in range(num_layers) if flags[i] == 0)


def _sliding_windows(arch: str, family: str, cfg: dict[str, Any], num_layers: int,
                     max_positions: int) -> tuple[int | None, tuple[int, ...]]:
    """The sliding window and the layers it applies to, as transformers reads them: GPT-OSS's `layer_types`
    (every other layer from the first where absent) over a window of `sliding_window` (128); Mistral's and
    Mixtral's and Phi-3's every layer (Mistral's window 4096 where config.json has none, the others' none); SmolLM3's
    sliding layers with `use_sliding_window`; Gemma 3's sliding layers (`_gemma3_sliding_layers`, a window of 4096
    where absent). A window that covers every position changes nothing and is dropped. Other families' windows
    are refused."""
    layer_types = config_value(cfg, "layer_types", list, [])
    typed = family in ("gpt_oss", "smollm3", "gemma3")  # (the families whose layer_types may name sliding layers)
    if any(t not in ("full_attention", "sliding_attention") for t in layer_types) or (
            not typed and any(t != "full_attention" for t in layer_types)):
        raise UnsupportedModelError(
            f"{arch} with layer types {sorted(set(map(str, layer_types)))}: only full attention is supported"
            + (" (and sliding_attention)" if typed else ""))
    if layer_types and len(layer_types) != num_layers:
        raise ConfigError(f"config.json: layer_types names {len(layer_types)} layers, num_hidden_layers is "
                          f"{num_layers}")
    mistral = arch in ("MistralForCausalLM", "MixtralForCausalLM", "Phi3ForCausalLM")
    if family == "gpt_oss":
        window = cfg.get("sliding_window", 128)
        layers = [i for i in range(num_layers)
                  if (layer_types[i] == "sliding_attention" if layer_types else i % 2 == 0)]
    elif mistral:
        window = cfg.get("sliding_window", 4096 if arch == "MistralForCausalLM" else None)  # (Phi-3's: none)
        layers = list(range(num_layers))
    elif family == "gemma3":
        window = cfg.get("sliding_window", 4096)
        layers = list(_gemma3_sliding_layers(cfg, num_layers))
    elif family == "smollm3":
        # A window only with use_sliding_window, on the layers layer_types names sliding (where absent, the NoPE
        # layers); transformers' masks follow layer_types, its attention use_sliding_window: refused where they
        # disagree.
        if not layer_types:
            nope = _nope_layers(cfg, num_layers)
            slide = bool(cfg.get("use_sliding_window")) and cfg.get("sliding_window") is not None
            layer_types = ["sliding_attention" if slide and i in nope else "full_attention" for i in range(num_layers)]
        layers = [i for i in range(num_layers) if layer_types[i] == "sliding_attention"]
        window = cfg.get("sliding_window") if layers else None
        if bool(layers) != bool(cfg.get("use_sliding_window") and window is not None):
            raise UnsupportedModelError(f"{arch} with use_sliding_window {cfg.get('use_sliding_window')!r}, "
                                        f"sliding_window {window!r} and sliding layers {layers}: transformers' masks "
                                        f"and its attention would disagree")
    else:
        # Qwen's windows apply only where use_sliding_window is set (then to some layers, differently in each
        # family); Llama's configs carry none.
        window = cfg.get("sliding_window") if family == "llama" else None
        if cfg.get("use_sliding_window") or window:
            raise UnsupportedModelError(f"{arch} with sliding-window attention is not supported")
        return None, ()
    if window is None:
        return None, ()
    if isinstance(window, bool) or not isinstance(window, int) or window < 1:
        # (0 is no window of any use: transformers fails)
        raise UnsupportedModelError(f"{arch} with sliding-window attention of sliding_window {window!r} is not "
                                    f"supported (a positive number of positions, or null)")
    if window >= max_positions or not layers:
        return None, ()
    return window, tuple(layers)


def _architecture(cfg: dict[str, Any]) -> str:
    """The architecture a config names: `architectures[0]` (one string is accepted too), else the model_type's."""
    archs = cfg.get("architectures")
    if isinstance(archs, str):  # a hand-written config may name its one architecture without the list
        archs = [archs]
    if archs is not None and not (isinstance(archs, list) and all(isinstance(a, str) for a in archs)):
        raise ConfigError(f"config.json: 'architectures' must be a list of names, e.g. [\"LlamaForCausalLM\"], "
                          f"got {archs!r}")
    model_type = cfg.get("model_type")
    if not archs and model_type in _MODEL_TYPES:
        return _MODEL_TYPES[model_type]
    if not archs:
        raise UnsupportedModelError("config.json names no architecture ('architectures' is missing)")
    # transformers builds the model model_type names (and vLLM the one architectures names): where they
    # disagree, one of them runs another model than the other.
    if archs[0] in SUPPORTED_ARCHITECTURES and model_type is not None and _MODEL_TYPES.get(model_type) != archs[0]:
        raise UnsupportedModelError(f"config.json names architecture {archs[0]} but model_type {model_type!r}, "
                                    f"which transformers would run as another model")
    return archs[0]


def read_config(path: str | Path, parse: Callable[[dict[str, Any]], T]) -> T:
    """`parse` applied to a directory's config.json; its ConfigErrors name the file, not just "config.json"."""
    cfg = read_config_json(path)
    try:
        return parse(cfg)
    except ConfigError as e:
        message = str(e)
        if message.startswith("config.json"):
            message = str(Path(path) / "config.json") + message[len("config.json"):]
        raise ConfigError(message) from None


def read_config_json(path: str | Path) -> dict[str, Any]:
    file = Path(path) / "config.json"
    if not file.is_file():
        raise FileNotFoundError(f"{path}: no config.json (expected a Hugging Face model directory)")
    return read_json_object(file)


def read_json_object(file: Path) -> dict[str, Any]:
    """A JSON file that holds an object (config.json, generation_config.json, ...), else a ConfigError
    naming the file."""
    try:
        value = json.loads(file.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ConfigError(f"{file}: malformed {file.name}: {e}") from None
    if not isinstance(value, dict):
        raise ConfigError(f"{file}: {file.name} must hold a JSON object, got {type(value).__name__}")
    return value
