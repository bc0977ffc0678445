"""Finding and loading checkpoints: HF directories of safetensors, GGUF files, the embedded default.

Only safetensors and GGUF are ever read: no pickle, and no code shipped with a checkpoint is run.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import warnings
from pathlib import Path

import torch
from safetensors import safe_open
from torch import nn

from treeflash.config import ModelConfig, UnsupportedModelError, read_config


# What a Hub repository's snapshot is downloaded with: config, tokenizer and template files, then the safetensors
# weights that `safetensors_files` would read; never pickled weights (.bin, .pt) or code (.py), which this engine
# does not read.
HUB_FILES = ("*.json", "*.jinja", "*.txt", "tokenizer.model", "*.tiktoken")
_REPO_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")
_REPO_GGUF = re.compile(r"([A-Za-z0-9][\w.-]*/[\w.-]+)/([\w./-]+\.gguf)", re.IGNORECASE)  # org/name/file.gguf
_REPO_TAG = re.compile(r"([A-Za-z0-9][\w.-]*/[\w.-]+):([\w.-]+)")  # org/name:Q4_K_M, as llama.cpp's -hf


def from_hub(repo_id: str, what: str = "model", revision: str | None = None) -> Path:
    """The local snapshot of a Hugging Face Hub repository ("Qwen/Qwen3-8B"), as transformers and vLLM take one:
    from the Hugging Face cache (HF_HOME, HF_HUB_CACHE), downloaded there first when absent or stale, offline
    (HF_HUB_OFFLINE=1, no network) from the cache alone. `HUB_FILES` first, then only the weights the model is
    read from, in `safetensors_files`' order: the index's shards, else model.safetensors, else every
    *.safetensors (a repository that also holds a consolidated copy is not fetched twice). `revision`: a branch,
    tag or commit; None, the main branch."""
    from huggingface_hub import snapshot_download

    def fetch(patterns: list[str]) -> Path:
        return Path(snapshot_download(repo_id, revision=revision, allow_patterns=patterns))

    try:
        snapshot = fetch(list(HUB_FILES))
        index = snapshot / "model.safetensors.index.json"
        if index.is_file():
            shards = sorted(set(json.loads(index.read_text()).get("weight_map", {}).values()))
            return fetch(shards or ["*.safetensors"])
        snapshot = fetch(["model.safetensors"])
        return snapshot if (snapshot / "model.safetensors").is_file() else fetch(["*.safetensors"])
    except Exception as e:  # noqa: BLE001 - the Hub's errors (not found, gated, offline) are named below
        at = "" if revision is None else f" at revision {revision!r}"
        raise FileNotFoundError(f"{repo_id}: no such {what} directory here, and no Hugging Face Hub repository of "
                                f"that name{at} could be fetched or found in the cache "
                                f"({type(e).__name__}: {e})") from None


def gguf_from_hub(repo_id: str, filename: str, revision: str | None = None) -> Path:
    """One GGUF file of a Hub repository ("bartowski/Qwen_Qwen3-8B-GGUF", "Qwen_Qwen3-8B-Q4_K_M.gguf"), from the
    Hugging Face cache, downloaded there when absent."""
    from huggingface_hub import hf_hub_download

    try:
        return Path(hf_hub_download(repo_id, filename, revision=revision))
    except Exception as e:  # noqa: BLE001 - as in from_hub
        raise FileNotFoundError(f"{repo_id}/{filename}: no such GGUF file here, and the Hugging Face Hub repository "
                                f"{repo_id} has no such file that could be fetched or found in the cache "
                                f"({type(e).__name__}: {e})") from None


def gguf_by_tag(repo_id: str, tag: str, revision: str | None = None) -> Path:
    """The GGUF file of a Hub repository whose name holds `tag` ("Q4_K_M", any case), as llama.cpp's `-hf
    org/name:Q4_K_M` picks one: fetched into the Hugging Face cache (only files whose names hold the tag), exactly
    one such file or a clear error (none, several, or one split in parts)."""
    from huggingface_hub import snapshot_download

    patterns = [f"*{t}*.gguf" for t in dict.fromkeys((tag, tag.upper(), tag.lower()))]
    try:
        snapshot = Path(snapshot_download(repo_id, revision=revision, allow_patterns=patterns,
                                          ignore_patterns=["*mmproj*"]))
    except Exception as e:  # noqa: BLE001 - as in from_hub
        raise FileNotFoundError(f"{repo_id}:{tag}: no such model here, and no GGUF file of that Hugging Face Hub "
                                f"repository could be fetched or found in the cache "
                                f"({type(e).__name__}: {e})") from None
    found = sorted(p for p in snapshot.rglob("*") if p.suffix.lower() == ".gguf" and tag.lower() in p.name.lower()
                   and "mmproj" not in p.name.lower())  # (a vision projector, not the model)
    if found and all(re.search(r"-\d{5}-of-\d{5}\.gguf$", p.name) for p in found):
        raise UnsupportedModelError(f"{repo_id}:{tag}: {found[0].name} is one part of a split GGUF, which this "
                                    f"engine does not read; merge the parts (llama-gguf-split --merge)")
    if len(found) != 1:
        names = [str(p.relative_to(snapshot)) for p in found]
        raise FileNotFoundError(f"{repo_id}:{tag}: " + (f"no GGUF file of the repository names {tag!r}" if not names
                                else f"{len(names)} GGUF files name {tag!r} ({', '.join(names[:6])}); name one as "
                                     f"{repo_id}/FILE.gguf"))
    return found[0]


def looks_like_repo_id(name: str | os.PathLike) -> bool:
    """"org/name" that is not a path here (as transformers decides: an existing directory wins)."""
    return isinstance(name, str) and bool(_REPO_ID.fullmatch(name)) and not Path(name).expanduser().exists()


def resolve_model_dir(model: str | Path | None, revision: str | None = None) -> Path:
    """A model argument (None = embedded default, a .gguf file, an HF directory, a Hugging Face Hub repository id:
    `from_hub`, or a GGUF file of one, "org/name/file.gguf": `gguf_from_hub`, or "org/name:Q4_K_M": `gguf_by_tag`)
    -> HF directory. `revision`: the
    Hub repository's branch, tag or commit (a local model has none: said and ignored, as transformers ignores
    it)."""
    from treeflash.gguf_convert import cached_conversion

    if model is not None and not isinstance(model, (str, os.PathLike)):
        raise ValueError(f"model must be a path (a model directory or a .gguf file), a Hub repository id or None, "
                         f"got {type(model).__name__}")
    path = None if model is None else Path(model).expanduser()
    if path is None or path.exists():
        if revision is not None:
            warnings.warn(f"revision={revision!r} is ignored: it names a version of a Hub repository, and "
                          f"{'the embedded model' if path is None else path} is not one", stacklevel=3)
        if path is None:
            from treeflash.default_model import default_gguf_path

            return cached_conversion(default_gguf_path())
        if path.is_file() and path.suffix.lower() == ".gguf":
            return cached_conversion(path)
        if path.is_dir():
            return path
        raise ValueError(f"{path}: expected a model directory (config.json + *.safetensors) or a .gguf file")
    if looks_like_repo_id(model):
        return from_hub(model, revision=revision)
    hub_gguf = _REPO_GGUF.fullmatch(model) if isinstance(model, str) else None
    if hub_gguf:
        return cached_conversion(gguf_from_hub(hub_gguf[1], hub_gguf[2], revision))
    tagged = _REPO_TAG.fullmatch(model) if isinstance(model, str) else None
    if tagged:
        return cached_conversion(gguf_by_tag(tagged[1], tagged[2], revision))
    raise FileNotFoundError(f"{path}: no such model directory or GGUF file")


def safetensors_files(model_dir: Path) -> list[Path]:
    """The weight files to read: the index's shards, else model.safetensors, else every *.safetensors."""
    index = model_dir / "model.safetensors.index.json"
    if index.is_file():
        return [model_dir / name for name in _index_shards(model_dir, index)]
    if (model_dir / "model.safetensors").is_file():
        # As transformers reads a directory: other safetensors files beside it (a consolidated.safetensors
        # of the same weights, a stray file) are not part of the model.
        return [model_dir / "model.safetensors"]
    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        found = sorted(p.name for p in model_dir.iterdir() if p.suffix in (".bin", ".pt", ".pth", ".ckpt"))
        hint = f" (found {found}: pickle-based weights are never loaded; convert them to safetensors)" if found else ""
        raise FileNotFoundError(f"{model_dir}: no *.safetensors weights{hint}")
    return files


def _index_shards(model_dir: Path, index: Path) -> list[str]:
    try:
        weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
    except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError) as e:
        raise ValueError(f"{index}: malformed safetensors index ({type(e).__name__}: {e})") from None
    if not isinstance(weight_map, dict) or not all(isinstance(v, str) and v for v in weight_map.values()):
        raise ValueError(f"{index}: malformed safetensors index (weight_map must map tensor names to file names)")
    names = sorted(set(weight_map.values()))
    # Shards live in the directory (a symlinked file is fine): an index must not point anywhere else.
    outside = [n for n in names if Path(n).is_absolute() or Path(os.path.normpath(n)).parts[:1] == ("..",)]
    if outside:
        raise ValueError(f"{index}: shards must be files of {model_dir}, got {outside[:3]}")
    missing = [n for n in names if not (model_dir / n).is_file()]
    if missing:
        raise FileNotFoundError(f"{model_dir}: shards listed in the index are missing: {missing}")
    return names


def read_safetensors(model_dir: Path, strip_prefix: str = "", read=None, select=None) -> dict[str, torch.Tensor]:
    """Every tensor of a directory's safetensors files by name; `read(key, slice)`, when given, reads
    only part of each (a tensor-parallel rank's shard, `models/parallel.py: Shard.read`); `select(name)`, when
    given, names the key each tensor is read as, None for one not to read (in place of strip_prefix)."""
    tensors: dict[str, torch.Tensor] = {}
    for file in safetensors_files(model_dir):
        try:
            with safe_open(str(file), framework="pt") as f:
                for name in f.keys():
                    if select is not None:
                        key = select(name)
                        if key is None:
                            continue
                    else:
                        key = name[len(strip_prefix):] if strip_prefix and name.startswith(strip_prefix) else name
                    if key in tensors:  # two files with one tensor: which to use is not ours to guess
                        raise _Refused(f"{file}: tensor {name} is also in another file of {model_dir}")
                    tensors[key] = f.get_tensor(name) if read is None else _read_part(read, key, f.get_slice(name))
        except _Refused as e:
            raise ValueError(f"{model_dir}: {e}" if str(e).startswith("tensor ") else str(e)) from None
        except Exception as e:  # safetensors raises its own error types for corrupt headers
            raise ValueError(f"{file}: cannot read safetensors file ({e})") from None
    return tensors


class _Refused(Exception):
    """A refusal of ours from inside the read, kept apart from safetensors' own errors."""


def _read_part(read, key: str, part):
    try:
        return read(key, part)
    except ValueError as e:
        raise _Refused(str(e)) from None


_FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)


def load_weights(module: nn.Module, tensors: dict[str, torch.Tensor], where: Path,
                 dtype: torch.dtype, device: torch.device | str, ignore: tuple[str, ...] = ()) -> None:
    """Assign checkpoint tensors to a module built on the meta device; every parameter must be present."""
    expected = {name: p for name, p in module.named_parameters()}
    missing = sorted(set(expected) - set(tensors))
    if missing:
        raise ValueError(f"{where}: checkpoint lacks {len(missing)} tensors, e.g. {missing[:3]}")
    unexpected = sorted(n for n in set(tensors) - set(expected) if not n.startswith(ignore) and "rotary" not in n)
    if unexpected:
        raise ValueError(f"{where}: checkpoint has tensors this model does not use, e.g. {unexpected[:3]}")
    for name, param in expected.items():
        t = tensors[name]
        if t.dtype not in _FLOAT_DTYPES:
            # Integer or fp8 tensors are quantised weights: cast as they are, they would be other numbers.
            raise ValueError(f"{where}: tensor {name} is {t.dtype}; only float32, float16 and bfloat16 weights "
                             f"are read (quantised checkpoints: a target's FP8 release with its "
                             f"quantization_config, a GGUF or an unquantised copy)")
        if tuple(t.shape) != tuple(param.shape):
            raise ValueError(f"{where}: tensor {name} has shape {tuple(t.shape)}, config implies {tuple(param.shape)}")
        owner, _, leaf = name.rpartition(".")
        setattr(module.get_submodule(owner), leaf, nn.Parameter(t.to(device=device, dtype=dtype), requires_grad=False))


# Checkpoint names the decoder (models/transformer.py, which keeps Llama's and Qwen's) calls otherwise, by
# architecture: (pattern, replacement) for each tensor's name, applied in order as the checkpoint is read.
_RENAMES = {
    "MixtralForCausalLM": ((r"\.block_sparse_moe\.", ".mlp."), (r"(\.experts\.\d+)\.w1\.", r"\1.gate_proj."),
                           (r"(\.experts\.\d+)\.w3\.", r"\1.up_proj."), (r"(\.experts\.\d+)\.w2\.", r"\1.down_proj.")),
    "GptOssForCausalLM": ((r"\.mlp\.router\.", ".mlp.gate."),),
}

# MXFP4's 4-bit codes (E2M1): sign, two exponent bits, one mantissa bit.
FP4_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)


def dequantize_mxfp4(blocks: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """MXFP4 weights as bfloat16 (exactly: every code times its power of two is a bfloat16). blocks: [..., G, 16]
    uint8, two codes a byte, the low nibble first; scales: [..., G] uint8, each group of 32 codes' power of two
    biased by 127. -> [..., G * 32]."""
    if blocks.dtype != torch.uint8 or scales.dtype != torch.uint8 or blocks.dim() < 2 or \
            blocks.shape[-1] != 16 or blocks.shape[:-1] != scales.shape:
        raise ValueError(f"MXFP4 blocks {tuple(blocks.shape)} {blocks.dtype} and scales {tuple(scales.shape)} "
                         f"{scales.dtype}: expected uint8 [..., G, 16] and [..., G]")
    lut = torch.tensor(FP4_VALUES, dtype=torch.float32)
    codes = torch.stack([blocks & 0x0F, blocks >> 4], dim=-1).flatten(-2)  # [..., G, 32]
    values = torch.ldexp(lut[codes.long()], (scales.to(torch.int32) - 127)[..., None].float())
    return values.flatten(-2).to(torch.bfloat16)


FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2)


def dequantize_fp8(weight: torch.Tensor, scale: torch.Tensor, block: tuple[int, int] | None,
                   dtype: torch.dtype) -> torch.Tensor:
    """An FP8 checkpoint's weight as `dtype`: weight [..., rows, cols] float8; scale float32 [..., ceil(rows /
    block[0]), ceil(cols / block[1])], each multiplying its block of the weight (the grid's last blocks cut short);
    with block None, one value or [..., rows, 1] (one a row). Multiplied in float32, then rounded once to dtype
    (transformers' order, so its dequantised model and this one hold the same numbers)."""
    if weight.dtype not in FP8_DTYPES or weight.dim() < 2:
        raise ValueError(f"an FP8 weight must be float8 with at least two dimensions, got {tuple(weight.shape)} "
                         f"{weight.dtype}")
    rows, cols = weight.shape[-2:]
    if block is not None:
        expected = (*weight.shape[:-2], -(-rows // block[0]), -(-cols // block[1]))
        if tuple(scale.shape) != expected:
            raise ValueError(f"scales {tuple(scale.shape)} for a weight {tuple(weight.shape)} in blocks of "
                             f"{list(block)}: expected {expected}")
        grid = scale.float().repeat_interleave(block[0], -2)[..., :rows, :].repeat_interleave(block[1], -1)
        return (weight.float() * grid[..., :cols]).to(dtype)
    per_row = (*weight.shape[:-1], 1)
    if scale.numel() == 1:
        grid = scale.float().reshape(())
    elif scale.numel() == math.prod(per_row) and scale.shape[-1:] in ((1,), (rows,)):
        grid = scale.float().reshape(per_row)
    else:
        raise ValueError(f"scales {tuple(scale.shape)} for a weight {tuple(weight.shape)}: expected one a tensor or "
                         f"one a row, {per_row}")
    return (weight.float() * grid).to(dtype)


# Scales that only an FP8 kernel would use (of activations, of the KV cache): read past.
_UNUSED_SCALES = (".activation_scale", ".input_scale", ".k_scale", ".v_scale")


def _dequantized_fp8(tensors: dict[str, torch.Tensor], fp8, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """Every float8 weight X.weight of an FP8 checkpoint times its scales beside it (X.weight_scale_inv or
    X.weight_scale: `fp8.scale_names`), one tensor at a time, each float8 copy freed as its product is made:
    loading peaks at about the model in `dtype` plus the float8 weights (a Qwen3-0.6B shape into bfloat16: 1.82 GB
    resident for a 1.19 GB model; benchmarks/cpu-fp8-load)."""
    scale_of = {}  # weight name -> its scale's
    for kind in reversed(fp8.scale_names):  # (the first name wins where a weight has two)
        scale_of |= {name.removesuffix(kind) + "weight": name for name in tensors if name.endswith("." + kind)}
    scales = set(scale_of.values())
    out = {}
    for name in list(tensors):
        if name in scales or name.endswith(_UNUSED_SCALES):
            continue
        t = tensors.pop(name)
        if t.dtype in FP8_DTYPES:
            if name not in scale_of:
                raise ValueError(f"tensor {name} is {t.dtype} with no {name}_scale_inv or {name}_scale beside it")
            try:
                t = dequantize_fp8(t, tensors.pop(scale_of.pop(name)), fp8.block, dtype)
            except ValueError as e:
                raise ValueError(f"tensor {name}: {e}") from None
        out[name] = t
    if scale_of:
        weight, scale = next(iter(scale_of.items()))
        raise ValueError(f"tensor {scale} scales {weight}, which is {'absent' if weight not in out else 'not float8'}")
    return out


def _unstack_gpt_oss_experts(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """GPT-OSS's experts as the decoder names them (`experts.{e}.gate_proj.weight`, ...). Its checkpoints hold a
    layer's experts stacked, input-major ([E, hidden, 2 x width], gate and up interleaved column by column, and
    [E, width, hidden]) with biases [E, 2 x width] and [E, hidden]; OpenAI's own hold the weights as MXFP4
    blocks and scales, output-major, read here as bfloat16."""
    out: dict[str, torch.Tensor] = {}
    for name, t in tensors.items():
        m = re.fullmatch(r"(layers\.\d+\.mlp\.experts)\.(gate_up_proj|down_proj)(_bias|_blocks|_scales)?", name)
        if m is None:
            out[name] = t
            continue
        prefix, proj, kind = m.groups()
        if kind == "_scales":
            continue  # read with its blocks
        if kind == "_blocks":
            scales = tensors.get(f"{prefix}.{proj}_scales")
            if scales is None:
                raise ValueError(f"tensor {name} has no {proj}_scales beside it")
            weight = dequantize_mxfp4(t, scales)  # [E, out, in]
        elif kind is None:
            if t.dim() != 3:
                raise ValueError(f"tensor {name} has shape {tuple(t.shape)}; expected [experts, in, out]")
            weight = t.transpose(1, 2)
        elif t.dim() != 2:
            raise ValueError(f"tensor {name} has shape {tuple(t.shape)}; expected [experts, out]")
        leaf = "bias" if kind == "_bias" else "weight"
        value = t if kind == "_bias" else weight
        for e in range(value.shape[0]):
            if proj == "gate_up_proj":
                out[f"{prefix}.{e}.gate_proj.{leaf}"] = value[e, 0::2]
                out[f"{prefix}.{e}.up_proj.{leaf}"] = value[e, 1::2]
            else:
                out[f"{prefix}.{e}.down_proj.{leaf}"] = value[e]
    return out


def load_target(model_dir: Path, device: torch.device | str, dtype: torch.dtype, shard=None):
    """Build the target decoder from an HF directory. Returns (Transformer, ModelConfig).

    shard: a tensor-parallel rank (`models/parallel.py: Shard`): the rank's decoder is built and only its
    slice of each weight is read; the returned config is still the whole model's.
    """
    from treeflash.models.transformer import Transformer

    cfg = ModelConfig.from_dir(model_dir)
    read = None if shard is None else (lambda key, part: shard.read(key, cfg, part))
    select = _language_model if cfg.architecture == "Gemma3ForConditionalGeneration" else None
    tensors = read_safetensors(model_dir, strip_prefix="model.", read=read, select=select)
    if cfg.fp8 is not None:
        try:
            tensors = _dequantized_fp8(tensors, cfg.fp8, dtype)
        except ValueError as e:
            raise ValueError(f"{model_dir}: {e}") from None
    renames = _RENAMES.get(cfg.architecture, ())
    for pattern, replacement in renames:
        tensors = {re.sub(pattern, replacement, name): t for name, t in tensors.items()}
    if cfg.architecture == "GptOssForCausalLM":
        try:
            tensors = _unstack_gpt_oss_experts(tensors)
        except ValueError as e:
            raise ValueError(f"{model_dir}: {e}") from None
    if cfg.architecture == "Phi3ForCausalLM":
        try:
            tensors = _unfuse_phi3(tensors, cfg)
        except ValueError as e:
            raise ValueError(f"{model_dir}: {e}") from None
    if cfg.rope.partial != 1.0:
        tensors = _rotated_first(tensors, cfg)
    if cfg.tie_word_embeddings and "lm_head.weight" in tensors:
        head, embed = tensors.pop("lm_head.weight"), tensors.get("embed_tokens.weight")
        if embed is None or head.shape != embed.shape or not torch.equal(head, embed):
            # As transformers (5.x) reads such a checkpoint: a shipped head that differs is kept, untied.
            warnings.warn(f"{model_dir}: config.json ties the embeddings but lm_head.weight differs from "
                          f"embed_tokens.weight; using the shipped lm_head (untied), as transformers does")
            cfg = dataclasses.replace(cfg, tie_word_embeddings=False)
            tensors["lm_head.weight"] = head
    with torch.device("meta"):
        model = Transformer(cfg) if shard is None else shard.build(cfg)
    load_weights(model, tensors, model_dir, dtype, device)
    model.rotary.to(device)
    if model.local_rotary is not None:
        model.local_rotary.to(device)
    stack_experts(model)
    return model.eval(), cfg


def _language_model(name: str) -> str | None:
    """A multimodal Gemma 3 checkpoint's text decoder tensors, by the decoder's names (transformers 4 saved them
    under language_model.model., 5 under model.language_model.); the vision tower's and projector's are not read."""
    for prefix in ("language_model.model.", "model.language_model."):
        if name.startswith(prefix):
            return name[len(prefix):]
    return "lm_head.weight" if name in ("language_model.lm_head.weight", "lm_head.weight") else None


def _unfuse_phi3(tensors: dict[str, torch.Tensor], cfg: ModelConfig) -> dict[str, torch.Tensor]:
    """Phi-3's fused projections as the separate ones the decoder has: qkv_proj's rows are q's, then k's, then
    v's; gate_up_proj's the gate's, then up's (transformers' Phi3MLP chunks it in two)."""
    q_rows, kv_rows = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
    out = {}
    for name, t in tensors.items():
        if name.endswith(".self_attn.qkv_proj.weight"):
            parts, width = ("q_proj", "k_proj", "v_proj"), (q_rows, kv_rows, kv_rows)
        elif name.endswith(".mlp.gate_up_proj.weight"):
            parts, width = ("gate_proj", "up_proj"), (cfg.intermediate_size,) * 2
        else:
            out[name] = t
            continue
        if t.ndim != 2 or t.shape[0] != sum(width):
            raise ValueError(f"tensor {name} has shape {tuple(t.shape)}, config.json implies {sum(width)} rows")
        prefix = name.rsplit(".", 2)[0]
        out |= {f"{prefix}.{part}.weight": piece for part, piece in zip(parts, t.split(width))}
    return out


def _rotated_first(tensors: dict[str, torch.Tensor], cfg: ModelConfig) -> dict[str, torch.Tensor]:
    """With a partial rotation (r of a head's d dimensions), reorder every head's query and key dimensions so
    that the rotated ones' halves sit at [0, r/2) and [d/2, d/2 + r/2) and the others fill the rest: rotate-half
    over the whole head then rotates exactly them (models/layers.py: rope_inv_freq). The same reordering of q
    and k leaves every score q.k as it is (up to the order of the sum)."""
    d, r = cfg.head_dim, int(cfg.head_dim * cfg.rope.partial)
    passed = list(range(r, d))
    order = torch.tensor(list(range(r // 2)) + passed[: d // 2 - r // 2] + list(range(r // 2, r))
                         + passed[d // 2 - r // 2:])
    out = dict(tensors)
    for name, t in tensors.items():
        if re.search(r"\.self_attn\.(q|k)_(proj\.(weight|bias)|norm\.weight)$", name):
            if name.endswith("norm.weight"):
                out[name] = t[order]
            else:  # one block of d rows a head
                out[name] = t.reshape(-1, d, *t.shape[1:])[:, order].reshape(t.shape)
    return out


def stack_experts(model: nn.Module) -> None:
    """Give every mixture-of-experts layer its experts' weights stacked (`SparseMoE.stack_experts`), once, at
    load: a forward then never allocates them (inside a CUDA graph's capture, say)."""
    from treeflash.models.layers import SparseMoE

    for module in model.modules():
        if isinstance(module, SparseMoE):
            module.stack_experts()


def load_drafter(path: str | Path, device: torch.device | str, dtype: torch.dtype):
    """Build a DFlash drafter from a z-lab format directory (or a Hub repository id: `from_hub`). Returns
    DFlashDrafter."""
    from treeflash.models.dflash import DFlashDrafter, DraftVocab, DrafterConfig

    if not isinstance(path, (str, os.PathLike)):
        raise ValueError(f"draft_model must be a path (a drafter directory), got {type(path).__name__}")
    path = from_hub(path, "drafter") if looks_like_repo_id(path) else Path(path).expanduser()
    if not path.is_dir():
        raise FileNotFoundError(f"{path}: no such drafter directory (expected config.json + *.safetensors)")
    cfg = read_config(path, DrafterConfig.from_hf)
    with torch.device("meta"):
        drafter = DFlashDrafter(cfg)
    load_weights(drafter, read_safetensors(path), path, dtype, device)
    drafter.rotary.to(device)
    drafter.draft_vocab = DraftVocab.load(path)
    return drafter.eval()


def load_tokenizer(model_dir: Path):
    """The HF tokenizer of a directory, or None when it ships none (token-id input still works)."""
    if not any((model_dir / f).is_file() for f in ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")):
        return None
    from transformers import AutoTokenizer

    # clean_up_tokenization_spaces would strip spaces before punctuation in BPE output.
    try:
        return AutoTokenizer.from_pretrained(str(model_dir), trust_remote_code=False, clean_up_tokenization_spaces=False)
    except Exception as e:  # transformers' own errors from deep inside (a JSONDecodeError, a KeyError): name the files
        raise ValueError(f"{model_dir}: cannot load its tokenizer files ({type(e).__name__}: {e})") from None
