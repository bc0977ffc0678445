"""Convert a llama.cpp GGUF checkpoint into a Hugging Face style directory.

The rest of the engine only loads HF directories (config.json + model.safetensors + tokenizer files),
so a GGUF is dequantised to float32 once and cached. Quantised weights are reproduced exactly as
llama.cpp's dequantisation defines them; nothing is re-quantised or cast to a lower precision.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import secrets
import shutil
import sys
import tempfile
import warnings
from pathlib import Path
from typing import Any

import numpy as np

from treeflash.config import UnsupportedModelError, unsupported_architecture

GGUF_MAGIC = b"GGUF"
# What a conversion could not do right (a pre-tokenizer it does not read), one line each, said at every load.
CAVEATS_FILE = "treeflash-caveats.txt"
# Bump when the output layout changes, so stale cache entries are not reused.
_CONVERTER_VERSION = 4  # 2: GGUF linear rope scaling read as llama.cpp reads it; 3: config.json names its writer;
# 4: pre-tokenizers by name, add_bos_token, end-of-turn stop tokens, shards past SHARD_BYTES
_READ_BYTES = 1 << 22
SHARD_BYTES = 2 << 30  # float32 weights a safetensors file at most (a tensor larger than that takes one alone)

_ARCHITECTURES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM",
                  "phi3": "Phi3ForCausalLM"}

_GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_BLOCK_NAMES = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_qkv": "self_attn.qkv_proj",  # (Phi-3's fused projections, split at load as its safetensors' are)
}
# Phi-3's ffn_up is its fused gate_up_proj: llama.cpp's SwiGLU takes the gate from the first half, as HF does.
_ARCH_BLOCK_NAMES = {"phi3": {"ffn_up": "mlp.gate_up_proj"}}
# RoPE parameters stored as tensors: read into config.json, not weights. Llama 3.1's per-frequency divisors;
# Phi-3's LongRoPE factors.
_ROPE_TENSORS = {"llama": ("rope_freqs.weight",), "phi3": ("rope_factors_long.weight", "rope_factors_short.weight")}
_BLOCK_RE = re.compile(r"blk\.(\d+)\.(\w+)\.(weight|bias)")


def hf_tensor_name(gguf_name: str, arch: str = "llama") -> str | None:
    """The HF parameter name for a llama.cpp tensor name of `arch`, or None when there is no counterpart."""
    if gguf_name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[gguf_name]
    m = _BLOCK_RE.fullmatch(gguf_name)
    names = _BLOCK_NAMES | _ARCH_BLOCK_NAMES.get(arch, {})
    if m and m.group(2) in names and (m.group(2) != "attn_qkv" or arch == "phi3"):
        return f"model.layers.{m.group(1)}.{names[m.group(2)]}.{m.group(3)}"
    return None


def unpermute_rotary(w: np.ndarray, n_heads: int) -> np.ndarray:
    """Undo llama.cpp's q/k row permutation for the `llama` architecture.

    llama.cpp rotates interleaved pairs (GPT-J style) while HF rotates the two halves of each head,
    so its converter reorders every head's rows from [first half, second half] to interleaved
    (x0, x_{d/2}, x1, x_{d/2+1}, ...). Reading the rows back as (head, d/2, 2) and swapping the last
    two axes restores the HF order. Applies to weights [rows, in] and biases [rows] alike.
    """
    head_dim = w.shape[0] // n_heads
    return w.reshape(n_heads, head_dim // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _check_magic(path: Path) -> None:
    if path.is_dir():
        raise ValueError(f"{path}: is a directory, not a GGUF file (a Hugging Face directory needs no conversion: "
                         f"pass it as --model / LLM(model=...) directly)")
    if not path.is_file():
        raise FileNotFoundError(f"{path}: GGUF file not found")
    with open(path, "rb") as f:
        magic = f.read(4)
    if magic != GGUF_MAGIC:
        raise ValueError(f"{path}: not a GGUF file (magic {magic!r}, expected {GGUF_MAGIC!r})")


def _open(path: Path) -> Any:
    """A GGUFReader for `path`, with errors that name the file instead of numpy internals."""
    import gguf

    _check_magic(path)
    try:
        reader = gguf.GGUFReader(path)
    except Exception as e:  # the reader fails deep inside numpy on truncated or corrupt files
        raise ValueError(f"{path}: corrupt or truncated GGUF file ({type(e).__name__}: {e})") from None
    for t in reader.tensors:
        if t.data.nbytes != t.n_bytes:
            raise ValueError(f"{path}: truncated GGUF file (tensor {t.name} is incomplete)")
    return reader


def _meta(reader: Any, key: str, default: Any = None) -> Any:
    field = reader.fields.get(key)
    return default if field is None else field.contents()


def _scalar(reader: Any, path: Path, key: str, kind: type, default: Any = None, minimum: float | None = 1) -> Any:
    """Metadata `key` as one number of `kind` (int or float), else a ValueError naming the key (a per-layer
    array, a string or a zero head count would otherwise fail deep inside the conversion)."""
    value = _meta(reader, key, default)
    if value is None:
        raise ValueError(f"{path}: GGUF metadata lacks {key}")
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)) or (
            kind is int and float(value) != int(value)):
        raise ValueError(f"{path}: GGUF metadata {key} must be one {kind.__name__}, got {value!r}")
    value = kind(value)
    if minimum is not None and value < minimum:
        raise ValueError(f"{path}: GGUF metadata {key} must be at least {minimum}, got {value!r}")
    return value


def _float32_value(x: float) -> float:
    """GGUF stores floats as float32; use the shortest decimal of that float32 (1e-05, not 9.99e-06)."""
    return float(str(np.float32(x)))


def _architecture(reader: Any, path: Path) -> str:
    arch = _meta(reader, "general.architecture")
    # (their safetensors checkpoints load; llama.cpp's expert tensors are laid out and named otherwise, and no
    # file of them was at hand to check a conversion against)
    if arch in ("qwen2moe", "qwen3moe", "gpt-oss"):
        raise UnsupportedModelError(f"{path.name}: GGUF files of mixtures of experts ({arch}) are not converted; "
                                    f"use the model's safetensors checkpoint (Hugging Face layout)")
    if arch not in _ARCHITECTURES:
        raise unsupported_architecture(f"{arch} (GGUF general.architecture in {path.name})")
    experts = _meta(reader, f"{arch}.expert_count")
    if experts:  # llama.cpp writes Mixtral as a llama with experts
        raise UnsupportedModelError(f"{path.name}: GGUF files of mixtures of experts ({arch} with {experts} "
                                    f"experts, e.g. Mixtral) are not converted; use the model's safetensors "
                                    f"checkpoint (Hugging Face layout)")
    return arch


def _hf_config(reader: Any, path: Path, tensor_shapes: dict[str, tuple[int, ...]],
               rope_tensors: dict[str, np.ndarray] | None = None) -> dict[str, Any]:
    """config.json for the GGUF; `rope_tensors`: its RoPE parameters stored as tensors (`_ROPE_TENSORS`)."""
    arch = _architecture(reader, path)
    rope_tensors = rope_tensors or {}

    def key(name: str, default: Any = None, kind: type = int, minimum: float | None = 1) -> Any:
        return _scalar(reader, path, f"{arch}.{name}", kind, default, minimum)

    hidden = key("embedding_length")
    heads = key("attention.head_count")
    head_dim = key("attention.key_length", hidden // heads)
    rotary_dim = key("rope.dimension_count", head_dim)
    if rotary_dim != head_dim and arch != "phi3":
        raise UnsupportedModelError(f"{path.name}: partial rotary embedding ({rotary_dim} of {head_dim} dims)")
    cfg: dict[str, Any] = {
        "architectures": [_ARCHITECTURES[arch]],
        "model_type": arch,
        "vocab_size": tensor_shapes["model.embed_tokens.weight"][0],
        "hidden_size": hidden,
        "intermediate_size": key("feed_forward_length"),
        "num_hidden_layers": key("block_count"),
        "num_attention_heads": heads,
        "num_key_value_heads": key("attention.head_count_kv", heads),
        "head_dim": head_dim,
        "rms_norm_eps": _float32_value(key("attention.layer_norm_rms_epsilon", kind=float, minimum=0)),
        "rope_theta": _float32_value(key("rope.freq_base", 10000.0, kind=float)),
        "max_position_embeddings": key("context_length"),
        "tie_word_embeddings": "lm_head.weight" not in tensor_shapes,
        "hidden_act": "silu",
        "torch_dtype": "float32",
    }
    if arch == "llama":
        cfg["attention_bias"] = "model.layers.0.self_attn.q_proj.bias" in tensor_shapes
        cfg["mlp_bias"] = False
    if arch == "phi3":
        cfg |= _phi3_config(reader, path, rope_tensors, cfg, rotary_dim)
    # As llama.cpp reads them: the type defaults to linear, the factor may sit under the old key
    # rope.scale_linear, and a factor of 0 (or 1) scales nothing. (Reading an absent type as "none" dropped
    # the scaling of files that give only a factor: other logits past a few positions.)
    scaling = _meta(reader, f"{arch}.rope.scaling.type", "linear")
    factor_key = next((k for k in ("rope.scaling.factor", "rope.scale_linear")
                       if _meta(reader, f"{arch}.{k}") is not None), None)
    factor = key(factor_key, kind=float, minimum=0) if factor_key else 0.0
    if scaling not in ("linear", "none"):
        raise UnsupportedModelError(f"{path.name}: unsupported rope scaling {scaling!r}")
    linear = scaling == "linear" and factor not in (0.0, 1.0)
    if linear:
        cfg["rope_scaling"] = {"rope_type": "linear", "factor": factor}
    if _ROPE_FREQS in rope_tensors:
        llama3 = _llama3_rope_scaling(rope_tensors[_ROPE_FREQS], cfg["rope_theta"], head_dim, path)
        if llama3 and linear:
            raise UnsupportedModelError(f"{path.name}: both {_ROPE_FREQS} and a linear rope scaling factor "
                                        f"({factor:g}); Llama 3's scaling is one or the other")
        if llama3:
            cfg["rope_scaling"] = llama3
    special = _special_token_ids(reader, path, cfg["vocab_size"])
    if "bos" in special:
        cfg["bos_token_id"] = special["bos"]
    if "padding" in special:  # (Phi3Config's default, 32,000, is past a smaller vocabulary)
        cfg["pad_token_id"] = special["padding"]
    # Instruct models often end a turn with a separate end-of-turn token; generation must stop there too.
    eos = []
    for k in ("eos", "eot", "eom"):
        if k in special and special[k] not in eos:
            eos.append(special[k])
    for end in _end_of_turn_ids(reader):
        if end not in eos:
            eos.append(end)
    if eos:
        cfg["eos_token_id"] = eos[0] if len(eos) == 1 else eos
    return cfg


_ROPE_FREQS = _ROPE_TENSORS["llama"][0]


def _llama3_divisors(theta: float, head_dim: int, factor: float, low: float, high: float, original: int
                     ) -> np.ndarray:
    """Each frequency's divisor under a Llama 3.1 rope_scaling, as the engine computes its frequencies
    (`rope_inv_freq`): what llama.cpp's converter stores as rope_freqs.weight."""
    from treeflash.config import RopeConfig
    from treeflash.models.layers import rope_inv_freq

    rope = RopeConfig(theta=theta, kind="llama3", factor=factor, low_freq_factor=low, high_freq_factor=high,
                      original_max_position_embeddings=original)
    return (rope_inv_freq(RopeConfig(theta=theta), head_dim) / rope_inv_freq(rope, head_dim)).double().numpy()


def _llama3_rope_scaling(divisors: np.ndarray, theta: float, head_dim: int, path: Path) -> dict[str, Any] | None:
    """The Llama 3.1 rope_scaling (as config.json says it) whose divisors a GGUF stores in rope_freqs.weight.

    llama.cpp keeps only the divisors. Parameters with the same ramp (its slope and intercept in 1 / wavelength)
    give the same divisors, so Meta's values are tried first, then ones fitted to the ramp; either must
    reproduce every divisor, or the file is refused: another RoPE would give other logits, silently."""
    if divisors.shape != (head_dim // 2,) or not np.all(np.isfinite(divisors)) or np.any(divisors <= 0):
        raise UnsupportedModelError(f"{path.name}: {_ROPE_FREQS} of shape {tuple(divisors.shape)} is not one "
                                    f"positive divisor for each of the {head_dim // 2} rotary frequencies")
    if np.all(divisors == 1):
        return None
    factor = _float32_value(float(divisors.max()))
    candidates = [(1.0, 4.0, 8192)]  # Llama 3.1, 3.2 and 3.3 (only the factor differs)
    inv_freq = 1.0 / theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    ramp = (divisors > 1 + 1e-6) & (divisors < factor * (1 - 1e-6))
    if ramp.sum() >= 2 and factor > 1:
        smooth = (1 / divisors[ramp] - 1 / factor) / (1 - 1 / factor)
        slope, intercept = np.polyfit(inv_freq[ramp] / (2 * np.pi), smooth, 1)
        if slope > 0 and intercept < 0:  # (low = 1; then high and the context follow from the ramp)
            original = int(round(-slope / intercept))
            high = float(1 + original / slope)
            candidates += [(1.0, round(high, 4), original), (1.0, high, original)]  # (the round one if it fits)
    for low, high, original in candidates:
        if np.allclose(_llama3_divisors(theta, head_dim, factor, low, high, original), divisors, rtol=1e-5, atol=0):
            return {"rope_type": "llama3", "factor": factor, "low_freq_factor": low, "high_freq_factor": high,
                    "original_max_position_embeddings": original}
    raise UnsupportedModelError(f"{path.name}: {_ROPE_FREQS} is no Llama 3 rope scaling (no factor, low/high "
                                f"frequency factors and pre-training context reproduce its divisors)")


# Control tokens that end a chat turn, by their text. Many GGUFs name only the end of text as EOS (early Llama 3
# ones end a turn with <|eot_id|> and say nothing of it; Phi-3's end with <|end|>), so llama.cpp stops at these
# too; so does the conversion (<|endoftext|>, which llama.cpp also stops at, is left to the file's EOS).
_END_OF_TURN = ("<|eot_id|>", "<|eom_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>")


def _end_of_turn_ids(reader: Any) -> list[int]:
    return [i for i, text in _control_tokens(reader) if text in _END_OF_TURN]


def _control_tokens(reader: Any) -> list[tuple[int, str]]:
    """(id, text) of the vocabulary's control tokens (llama.cpp's token type 3)."""
    tokens, types = reader.fields.get("tokenizer.ggml.tokens"), reader.fields.get("tokenizer.ggml.token_type")
    if tokens is None or types is None:
        return []
    return [(i, text) for i, (text, kind) in enumerate(zip(tokens.contents(), types.contents())) if kind == 3]


def _special_token_ids(reader: Any, path: Path, vocab_size: int) -> dict[str, int]:
    """tokenizer.ggml.{bos,eos,eot,eom,unknown,padding}_token_id, each checked to be a token of the model."""
    tokens = reader.fields.get("tokenizer.ggml.tokens")
    size = vocab_size if tokens is None else min(vocab_size, len(tokens.data))
    out = {}
    for name in ("bos", "eos", "eot", "eom", "unknown", "padding"):
        key = f"tokenizer.ggml.{name}_token_id"
        if _meta(reader, key) is not None:
            out[name] = _scalar(reader, path, key, int, minimum=0)
            if out[name] >= size:
                raise ValueError(f"{path}: GGUF metadata {key} is {out[name]}, past the {size} tokens")
    return out


def _tensor_plan(reader: Any, path: Path) -> list[tuple[Any, str, tuple[int, ...]]]:
    """(GGUF tensor, HF name, HF shape) for every weight, checked before anything is dequantised."""
    arch = _architecture(reader, path)
    plan = []
    for t in reader.tensors:
        if t.name in _ROPE_TENSORS.get(arch, ()):
            continue  # (RoPE parameters, not weights: `_rope_tensors` reads them into config.json)
        name = hf_tensor_name(t.name, arch)
        if name is None:
            # Dropping an unknown tensor (e.g. Gemma's post-norms) would silently change the model.
            raise UnsupportedModelError(f"{path.name}: tensor {t.name!r} has no Hugging Face counterpart")
        # GGUF lists dims fastest-first ([in, out]); numpy's row-major order is the reverse, i.e. HF's.
        plan.append((t, name, tuple(int(d) for d in reversed(t.shape))))
    if not any(name == "model.embed_tokens.weight" for _, name, _ in plan):
        raise ValueError(f"{path}: GGUF has no token_embd.weight tensor")
    return plan


def _dequantized(path: Path, t: Any, shape: tuple[int, ...], permuted_heads: int | None) -> np.ndarray:
    """One tensor in float32, in HF's layout; permuted_heads: llama.cpp's q/k row order to undo, over that
    many heads (Llama's q and k), else None."""
    import gguf

    try:
        w = gguf.quants.dequantize(t.data, t.tensor_type)
    except NotImplementedError as e:
        raise UnsupportedModelError(f"{path.name}: tensor {t.name}: {e}") from None
    w = w.reshape(shape).astype(np.float32, copy=False)
    if permuted_heads is not None:
        w = unpermute_rotary(w, permuted_heads)
    return np.ascontiguousarray(w)


def _write_weights(reader: Any, path: Path, plan: list[tuple[Any, str, tuple[int, ...]]], out: Path,
                   shard_bytes: int) -> None:
    """The weights as float32 safetensors: model.safetensors, or shards of at most `shard_bytes` (a tensor
    larger than that alone) with the index transformers writes. Each shard is dequantised, written and let go
    before the next, so converting a 3B model takes one shard's memory rather than all 12 GB of float32."""
    from safetensors.numpy import save_file

    shards: list[list[tuple[Any, str, tuple[int, ...]]]] = [[]]
    size = 0
    for item in plan:
        nbytes = 4 * math.prod(item[2])
        if shards[-1] and size + nbytes > shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append(item)
        size += nbytes
    files = (["model.safetensors"] if len(shards) == 1 else
             [f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))])
    from tqdm import tqdm

    arch = _architecture(reader, path)
    heads = _scalar(reader, path, f"{arch}.attention.head_count", int)
    kv_heads = _scalar(reader, path, f"{arch}.attention.head_count_kv", int, heads)

    def permuted_heads(name: str) -> int | None:
        if arch != "llama":
            return None
        return heads if ".self_attn.q_proj." in name else kv_heads if ".self_attn.k_proj." in name else None

    # (a large file takes a while; the bar is off where stderr is not a terminal)
    with tqdm(total=len(plan), desc="dequantising", unit="tensor", disable=None, leave=False) as bar:
        for shard, file in zip(shards, files):
            tensors = {}
            for t, name, shape in shard:
                tensors[name] = _dequantized(path, t, shape, permuted_heads(name))
                bar.update()
            save_file(tensors, str(out / file), metadata={"format": "pt"})
            del tensors
    if len(shards) > 1:
        index = {"metadata": {"total_size": sum(4 * math.prod(shape) for _, _, shape in plan)},
                 "weight_map": {name: file for shard, file in zip(shards, files) for _, name, _ in shard}}
        (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")


def _rope_tensors(reader: Any, path: Path) -> dict[str, np.ndarray]:
    """The file's RoPE parameters stored as tensors (`_ROPE_TENSORS`), as float64 vectors."""
    import gguf

    names = _ROPE_TENSORS.get(_architecture(reader, path), ())
    return {t.name: gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float64).reshape(-1)
            for t in reader.tensors if t.name in names}


def _phi3_config(reader: Any, path: Path, rope_tensors: dict[str, np.ndarray], cfg: dict[str, Any],
                 rotary_dim: int) -> dict[str, Any]:
    """Phi-3's config.json keys, from what llama.cpp's converter writes: the rotated share of each head
    (Phi-4-mini's 0.75), the window (0 for none: Phi-4), the pre-training context, and LongRoPE's factors
    (128k models), whose cos/sin scale transformers derives from the two contexts as llama.cpp's converter
    did (a file whose stored scale differs keeps its own)."""
    def key(name: str, default: Any = None, kind: type = int, minimum: float | None = 1) -> Any:
        return _scalar(reader, path, f"phi3.{name}", kind, default, minimum)

    out: dict[str, Any] = {}
    if rotary_dim != cfg["head_dim"]:
        out["partial_rotary_factor"] = rotary_dim / cfg["head_dim"]
    window = key("attention.sliding_window", 0, minimum=0)
    out["sliding_window"] = window or None
    context = cfg["max_position_embeddings"]
    original = key("rope.scaling.original_context_length", context)
    out["original_max_position_embeddings"] = original
    factors = [rope_tensors.get(f"rope_factors_{kind}.weight") for kind in ("short", "long")]
    if any(f is not None for f in factors):
        if any(f is None or f.shape != (rotary_dim // 2,) for f in factors):
            raise UnsupportedModelError(f"{path.name}: LongRoPE needs rope_factors_short and rope_factors_long of "
                                        f"{rotary_dim // 2} values each")
        rope = {"rope_type": "longrope", "short_factor": [_float32_value(v) for v in factors[0]],
                "long_factor": [_float32_value(v) for v in factors[1]]}
        scale = context / original
        derived = math.sqrt(1 + math.log(scale) / math.log(original)) if scale > 1 else 1.0
        stored = key("rope.scaling.attn_factor", derived, kind=float, minimum=0)
        if abs(stored - derived) > 1e-6 * derived:
            rope["attention_factor"] = stored
        out["rope_scaling"] = rope
    return out


# Byte-level BPE pre-tokenizers by llama.cpp's names (tokenizer.ggml.pre): the split each model's own
# tokenizer.json makes, and whether llama.cpp adds a BOS where the file does not say. transformers' GGUF import
# ignores the name and splits every `llama` file as GPT-2 does, which groups digits and spaces otherwise
# ("in 2024" became other tokens than Llama 3 was trained on). Llama 3's split is cl100k's; Mistral Nemo's
# (tekken) is o200k's kind; SmolLM's is GPT-2's after every digit alone.
_LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                 r"|\s*[\r\n]+|\s+(?!\S)|\s+")
_TEKKEN_SPLIT = (r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
                 r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"
                 r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_PRE_SPLITS = {name: (_LLAMA3_SPLIT, True) for name in ("llama3", "llama-v3", "llama-bpe", "falcon3", "pixtral")}
_PRE_SPLITS["tekken"] = (_TEKKEN_SPLIT, True)
# The names whose split transformers' import already makes (GPT-2's for `llama` files, Qwen2's for Qwen's).
_PRE_AS_READ = {"llama": ("default", "gpt-2"), "qwen2": ("qwen2", "deepseek-r1-qwen"),
                "qwen3": ("qwen2", "deepseek-r1-qwen")}


def _fix_tokenizer(reader: Any, path: Path, tok: Any) -> list[str]:
    """Set what transformers' GGUF import gets wrong, as llama.cpp reads the same metadata: the pre-tokenizer
    (`_PRE_SPLITS`) with whole-word lookup, and the BOS / EOS that tokenizer.ggml.add_{bos,eos}_token ask for
    (transformers adds neither, so a plain prompt to Llama or Mistral lost its BOS). Where the file does not
    say, llama.cpp adds a BOS for SentencePiece vocabularies, Llama 3's and Mistral Nemo's. A pre-tokenizer
    neither fixed here nor read right by transformers is kept as read; the caveat is returned, to be said at
    every load (`CAVEATS_FILE`)."""
    from tokenizers import Regex, pre_tokenizers, processors

    backend, caveats = tok.backend_tokenizer, []
    model, pre = _meta(reader, "tokenizer.ggml.model"), _meta(reader, "tokenizer.ggml.pre", "default")
    split, bos_default = _PRE_SPLITS.get(pre, (None, model == "llama")) if model == "gpt2" else (None, True)
    if split is not None:
        backend.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(split), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False)])
        backend.model.ignore_merges = True  # (a whole pre-token in the vocabulary is one token)
        tok.clean_up_tokenization_spaces = False  # (transformers' import sets it; decoding a BPE ignores it)
    elif model == "gpt2" and pre == "smollm":
        backend.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True)])
    elif model == "gpt2" and pre not in _PRE_AS_READ.get(_architecture(reader, path), ()):
        caveats.append(f"{path.name}: its pre-tokenizer {pre!r} is not one treeflash reads; text is split as "
                       f"transformers' GGUF import splits it, which may differ from the model's own tokenizer "
                       f"(token ids given directly are unaffected)")
    tokens = reader.fields["tokenizer.ggml.tokens"]
    ends = []
    for key, default in (("bos", bos_default), ("eos", False)):
        token_id = _meta(reader, f"tokenizer.ggml.{key}_token_id")
        if token_id is not None and _meta(reader, f"tokenizer.ggml.add_{key}_token", default):
            ends.append((key, tokens.contents(int(token_id)), int(token_id)))
    if ends:
        first = [f"{t}:0" for key, t, _ in ends if key == "bos"]
        last = [f"{t}:0" for key, t, _ in ends if key == "eos"]
        backend.post_processor = processors.TemplateProcessing(
            single=first + ["$A:0"] + last, pair=first + ["$A:0"] + last + first + ["$B:1"] + last,
            special_tokens=sorted({(t, i) for _, t, i in ends}))
    return caveats


def _phi3_tokenizer(reader: Any, path: Path, gguf_file: Path) -> Any:
    """Phi-3's SentencePiece tokenizer, built as Llama's is. transformers' own GGUF import of Phi-3 builds a
    BPE without SentencePiece's spaces ("ten tea" comes back "tentea"); its Llama import is the one that reads
    such a vocabulary right. Phi-3's chat tokens then strip the whitespace after them, as its tokenizer.json
    says and llama.cpp does for Phi-3 (every control token but <unk>, <s> and <|endoftext|>, and </s>)."""
    from tokenizers import AddedToken
    from transformers import PreTrainedTokenizerFast
    from transformers.integrations.ggml import convert_gguf_tokenizer
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    model = _meta(reader, "tokenizer.ggml.model")
    if model != "llama":
        raise UnsupportedModelError(f"{path.name}: a Phi-3 GGUF with a {model!r} tokenizer (Phi-4's kind) is not "
                                    f"converted: its pre-tokenizer is not read; use the safetensors checkpoint")
    backend, _ = convert_gguf_tokenizer("llama", load_gguf_checkpoint(str(gguf_file))["tokenizer"])
    control = [text for _, text in _control_tokens(reader)]
    has_eos = "</s>" in reader.fields["tokenizer.ggml.tokens"].contents()
    stripping = dict.fromkeys(control + (["</s>"] if has_eos else []))  # (never a token of its own)
    backend.add_special_tokens([AddedToken(t, rstrip=True, normalized=False, special=True)
                                for t in stripping if t not in ("<unk>", "<s>", "<|endoftext|>")])
    return PreTrainedTokenizerFast(tokenizer_object=backend)


def _save_tokenizer(reader: Any, path: Path, out: Path, context_length: int) -> list[str]:
    """Write the tokenizer files; returns what the conversion could not do right (`_fix_tokenizer`)."""
    from transformers import AutoTokenizer

    # Alone in a directory of its own: from the GGUF's folder, transformers would read any tokenizer files
    # lying beside it (another model's, say) before the GGUF's, and offer to run code that one names.
    with tempfile.TemporaryDirectory(prefix="treeflash-gguf-") as alone:
        os.symlink(path.resolve(), Path(alone) / "model.gguf")
        if _architecture(reader, path) == "phi3":
            tok = _phi3_tokenizer(reader, path, Path(alone) / "model.gguf")
        else:
            tok = AutoTokenizer.from_pretrained(alone, gguf_file="model.gguf", trust_remote_code=False)
    # transformers' GGUF import mislabels special tokens (SmolLM2 gets eos = <|im_start|>); the GGUF
    # metadata is authoritative.
    tokens = reader.fields["tokenizer.ggml.tokens"]
    for attr, key in (("bos_token", "bos"), ("eos_token", "eos"), ("unk_token", "unknown"), ("pad_token", "padding")):
        token_id = _meta(reader, f"tokenizer.ggml.{key}_token_id")
        if token_id is not None:
            setattr(tok, attr, tokens.contents(int(token_id)))
    caveats = _fix_tokenizer(reader, path, tok)
    template = _meta(reader, "tokenizer.chat_template")
    if template:
        tok.chat_template = template
    tok.model_max_length = context_length
    tok.save_pretrained(out)
    # transformers >= 5 saves the template as chat_template.jinja only; also keep it in
    # tokenizer_config.json for readers that look there (older transformers, plain JSON readers).
    if template:
        cfg_file = out / "tokenizer_config.json"
        tok_cfg = json.loads(cfg_file.read_text())
        tok_cfg["chat_template"] = template
        cfg_file.write_text(json.dumps(tok_cfg, indent=2, ensure_ascii=False) + "\n")
    return caveats


def convert_gguf(gguf_path: str | Path, out_dir: str | Path, *, tokenizer: bool = True,
                 shard_bytes: int = SHARD_BYTES) -> Path:
    """Dequantise `gguf_path` into a new HF directory `out_dir` (float32 safetensors, config.json, tokenizer).

    The directory appears atomically: everything is written to a temporary sibling that is renamed
    at the end, so a crash never leaves a half-written directory. `tokenizer=False` skips the
    tokenizer files (for checkpoints without tokenizer metadata, e.g. in tests). Weights past `shard_bytes`
    of float32 are written in shards, one at a time (`_write_weights`).
    """
    path, out = Path(gguf_path), Path(out_dir)
    if out.exists():
        raise FileExistsError(f"{out}: output directory already exists")
    reader = _open(path)
    _architecture(reader, path)
    if tokenizer and "tokenizer.ggml.tokens" not in reader.fields:
        raise ValueError(f"{path}: GGUF has no tokenizer (tokenizer.ggml.tokens is missing)")
    plan = _tensor_plan(reader, path)
    config = _hf_config(reader, path, {name: shape for _, name, shape in plan}, _rope_tensors(reader, path))
    if tokenizer:
        import transformers

        # The version of transformers that writes the tokenizer, as save_pretrained records it; without it
        # transformers >= 5 takes a Qwen2 tokenizer's directory for an old Mistral one and warns that its
        # pre-tokenizer regex is wrong (it is not: the GGUF's own is kept).
        config["transformers_version"] = transformers.__version__
    out.parent.mkdir(parents=True, exist_ok=True)
    # Not tempfile.mkdtemp: its 0700 mode would survive the rename and make a shared cache private.
    tmp = out.parent / f".{out.name}.tmp-{os.getpid()}-{secrets.token_hex(4)}"
    tmp.mkdir()
    try:
        _write_weights(reader, path, plan, tmp, shard_bytes)
        (tmp / "config.json").write_text(json.dumps(config, indent=2) + "\n")
        caveats = _save_tokenizer(reader, path, tmp, config["max_position_embeddings"]) if tokenizer else []
        if caveats:
            (tmp / CAVEATS_FILE).write_text("".join(c + "\n" for c in caveats))
        try:
            os.rename(tmp, out)
        except OSError:
            # Another process finished the same conversion first; its result is as good as ours.
            if not (out / "config.json").is_file():
                raise
            shutil.rmtree(tmp)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    for caveat in caveats:
        warnings.warn(caveat, stacklevel=2)
    return out


def warn_caveats(converted: Path) -> None:
    """Say again what converting the GGUF could not do right (a later load from the cache is otherwise silent)."""
    try:
        caveats = (converted / CAVEATS_FILE).read_text().splitlines()
    except OSError:
        return
    for caveat in caveats:
        warnings.warn(caveat, stacklevel=3)


def gguf_cache_key(gguf_path: str | Path, memo_dir: str | Path | None = None) -> str:
    """A content hash of the whole GGUF: two files share a conversion only when their bytes are equal.

    (A hash of the size and the first and last MiB, as before, let two same-size files that differ in the
    middle share one conversion, and a file rewritten in place reuse its stale one.) Hashing reads the
    file once (0.14 s for the default 98 MB one on a 2-core CPU); a digest that `remember_cache_key` kept
    in `memo_dir` for this version of the file is used instead.
    """
    path = Path(gguf_path)
    if memo_dir is not None:
        try:
            known = _memo(path, memo_dir).read_text().strip()
            if len(known) == 16 and all(c in "0123456789abcdef" for c in known):
                return known
        except OSError:
            pass
    h = hashlib.blake2b(f"treeflash-gguf-v{_CONVERTER_VERSION}:".encode())
    with open(path, "rb") as f:
        while chunk := f.read(_READ_BYTES):
            h.update(chunk)
    return h.hexdigest()[:16]


def remember_cache_key(gguf_path: str | Path, memo_dir: str | Path, key: str) -> None:
    """Keep `key` for this version of the file, so the next load need not read it all again."""
    memo = _memo(Path(gguf_path), memo_dir)
    try:  # a lost race or a read-only cache only costs the next load a re-read
        memo.parent.mkdir(parents=True, exist_ok=True)
        tmp = memo.with_name(f".{memo.name}.{os.getpid()}-{secrets.token_hex(4)}")
        tmp.write_text(key + "\n")
        os.replace(tmp, memo)
    except OSError:
        pass


def _memo(path: Path, memo_dir: str | Path) -> Path:
    # A version of a file: its path, inode, size, mtime and ctime (any write changes the ctime, which no
    # tool sets back), under this converter's version (a digest kept by an older converter names its output).
    st = path.stat()
    version = (f"v{_CONVERTER_VERSION}:{path.resolve()}:{st.st_dev}:{st.st_ino}:{st.st_size}:{st.st_mtime_ns}:"
               f"{st.st_ctime_ns}")
    return Path(memo_dir) / hashlib.blake2b(version.encode(), digest_size=16).hexdigest()


def default_cache_dir() -> Path:
    return Path(os.environ.get("TREEFLASH_CACHE") or Path.home() / ".cache" / "treeflash")


def cached_conversion(gguf_path: str | Path, cache_dir: str | Path | None = None) -> Path:
    """The converted HF directory for `gguf_path`, converting only on the first call.

    Lives in `<cache_dir or $TREEFLASH_CACHE or ~/.cache/treeflash>/converted/<stem>-<content hash>`.
    """
    path = Path(gguf_path)
    _check_magic(path)  # truncated files hash differently and fail in convert_gguf
    converted = Path(cache_dir or default_cache_dir()) / "converted"
    digests = converted / ".digests"
    key = gguf_cache_key(path, digests)
    out = converted / f"{path.stem}-{key}"
    if not (out / "config.json").is_file():
        # The first use takes a while (dequantising every tensor): say what is happening and where it goes.
        print(f"treeflash: converting {path.name} once to safetensors in {out} (set TREEFLASH_CACHE to move the "
              f"cache)", file=sys.stderr, flush=True)
        convert_gguf(path, out)
    else:
        warn_caveats(out)
    remember_cache_key(path, digests, key)
    return out
