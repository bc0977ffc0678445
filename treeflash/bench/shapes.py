"""Real model shapes with random weights: targets and DFlash drafters built on the device, no checkpoint.

Per-round cost depends on shapes, not on weight values, so a random model at a real target's shape
times a round as the trained one would (acceptance aside). Target shapes are those of the public model
cards' config.json. No public drafter exists for every target; the drafters here follow the public
z-lab / SpecForge recipe for 4B-8B targets: 5 Qwen3-style layers at the target's hidden size, heads
and MLP width, block size 16, context features from 5 target layers spread over [1, N-3]. SmolLM2-135M's
drafter is the shape of the one this package ships for it (treeflash/default_drafter/: 3 layers reading
5 target layers), since that is the drafter its rounds run with.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from treeflash.checkpoint import stack_experts
from treeflash.config import ModelConfig
from treeflash.models.dflash import DFlashDrafter, DrafterConfig
from treeflash.models.layers import Rotary, SparseMoE
from treeflash.models.transformer import Transformer


@dataclass(frozen=True)
class Shape:
    name: str
    target: dict[str, Any] = field(hash=False)  # the target's config.json
    mask_token_id: int  # a row of the target's embedding the drafter uses as MASK
    drafter_layers: int = 5
    block_size: int = 16
    target_layer_ids: tuple[int, ...] | None = None  # the drafter's context layers (None: spread, as z-lab's)


def _qwen3(layers, hidden, heads, kv_heads, intermediate, tie) -> dict[str, Any]:
    return {"architectures": ["Qwen3ForCausalLM"], "vocab_size": 151936, "hidden_size": hidden,
            "intermediate_size": intermediate, "num_hidden_layers": layers, "num_attention_heads": heads,
            "num_key_value_heads": kv_heads, "head_dim": 128, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0,
            "tie_word_embeddings": tie, "max_position_embeddings": 40960, "hidden_act": "silu"}


def _qwen3_moe(layers, hidden, heads, kv_heads, intermediate, experts, per_token, expert_width) -> dict[str, Any]:
    return {**_qwen3(layers, hidden, heads, kv_heads, intermediate, tie=False), "architectures": ["Qwen3MoeForCausalLM"],
            "num_experts": experts, "num_experts_per_tok": per_token, "moe_intermediate_size": expert_width,
            "norm_topk_prob": True}


def _mixtral(layers, hidden, heads, kv_heads, intermediate, experts, per_token) -> dict[str, Any]:
    return {**_llama(layers, hidden, heads, kv_heads, intermediate, 32000, tie=False, theta=1000000.0,
                     max_pos=32768), "architectures": ["MixtralForCausalLM"], "num_local_experts": experts,
            "num_experts_per_tok": per_token, "sliding_window": None}


def _gpt_oss(layers, experts) -> dict[str, Any]:
    """GPT-OSS-20B (24 layers, 32 experts) and -120B (36, 128): 4 experts of width 2,880 a token, 64 query heads
    of 64 over 8 KV heads, a 128-token window on every other layer, YaRN over 4,096 positions x 32."""
    return {"architectures": ["GptOssForCausalLM"], "vocab_size": 201088, "hidden_size": 2880,
            "intermediate_size": 2880, "num_hidden_layers": layers, "num_attention_heads": 64,
            "num_key_value_heads": 8, "head_dim": 64, "rms_norm_eps": 1e-5, "tie_word_embeddings": False,
            "max_position_embeddings": 131072, "num_local_experts": experts, "num_experts_per_tok": 4,
            "sliding_window": 128, "swiglu_limit": 7.0, "attention_bias": True,
            "rope_scaling": {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0,
                             "truncate": False, "original_max_position_embeddings": 4096, "rope_theta": 150000.0}}


def _llama(layers, hidden, heads, kv_heads, intermediate, vocab, tie, theta, max_pos) -> dict[str, Any]:
    return {"architectures": ["LlamaForCausalLM"], "vocab_size": vocab, "hidden_size": hidden,
            "intermediate_size": intermediate, "num_hidden_layers": layers, "num_attention_heads": heads,
            "num_key_value_heads": kv_heads, "head_dim": hidden // heads, "rms_norm_eps": 1e-5,
            "rope_theta": theta, "tie_word_embeddings": tie, "max_position_embeddings": max_pos,
            "hidden_act": "silu"}


def _smollm3() -> dict[str, Any]:
    """SmolLM3-3B: a Llama of 36 layers, every fourth without rotary embeddings (NoPE), tied embeddings."""
    return {**_llama(36, 2048, 16, 4, 11008, 128256, tie=True, theta=5000000.0, max_pos=65536),
            "architectures": ["SmolLM3ForCausalLM"], "rms_norm_eps": 1e-6, "no_rope_layer_interval": 4}


def _phi4_mini() -> dict[str, Any]:
    """Phi-4-mini: 32 layers, 24 query heads of 128 over 8 KV heads, three quarters of each head rotated with
    LongRoPE, tied embeddings of a 200,064-token vocabulary. Its LongRoPE factors are placeholders (the shape and
    the kernels are what a round's time depends on); the context is the short factors' 4,096 positions, as
    loading the model gives it, with the cos/sin scale its 131,072 / 4,096 positions give."""
    return {"architectures": ["Phi3ForCausalLM"], "vocab_size": 200064, "hidden_size": 3072,
            "intermediate_size": 8192, "num_hidden_layers": 32, "num_attention_heads": 24, "num_key_value_heads": 8,
            "rms_norm_eps": 1e-5, "tie_word_embeddings": True, "max_position_embeddings": 4096,
            "original_max_position_embeddings": 4096, "partial_rotary_factor": 0.75, "hidden_act": "silu",
            "rope_scaling": {"rope_type": "longrope", "rope_theta": 10000.0, "short_factor": [1.0] * 48,
                             "long_factor": [1.0] * 48,
                             "attention_factor": math.sqrt(1 + math.log(32) / math.log(4096))}}


def _gemma3_1b() -> dict[str, Any]:
    """Gemma 3 1B: 26 layers, 4 query heads of 256 over 1 KV head, every sixth layer full and the others a 512-token
    window with a RoPE base of 10,000 (the full ones 1,000,000), tied embeddings of a 262,144-token vocabulary."""
    return {"architectures": ["Gemma3ForCausalLM"], "vocab_size": 262144, "hidden_size": 1152,
            "intermediate_size": 6912, "num_hidden_layers": 26, "num_attention_heads": 4, "num_key_value_heads": 1,
            "head_dim": 256, "query_pre_attn_scalar": 256, "rms_norm_eps": 1e-6, "tie_word_embeddings": True,
            "max_position_embeddings": 32768, "sliding_window": 512, "sliding_window_pattern": 6,
            "rope_theta": 1000000.0, "rope_local_base_freq": 10000.0, "hidden_activation": "gelu_pytorch_tanh"}


# Qwen3's DFlash drafters use <|MASK|> (id 151669, an embedding row past the tokenizer's last id);
# Llama 3 has reserved special ids from 128002; SmolLM2's ids 3-16 are unused special tokens.
SHAPES: dict[str, Shape] = {
    "qwen3-8b": Shape("qwen3-8b", _qwen3(36, 4096, 32, 8, 12288, tie=False), mask_token_id=151669),
    "qwen3-4b": Shape("qwen3-4b", _qwen3(36, 2560, 32, 8, 9728, tie=True), mask_token_id=151669),
    # A mixture of experts (Qwen3-30B-A3B, Qwen3-Coder-30B-A3B): 128 experts of width 768, 8 per token.
    "qwen3-30b-a3b": Shape("qwen3-30b-a3b", _qwen3_moe(48, 2048, 32, 4, 6144, 128, 8, 768), mask_token_id=151669),
    # Mixtral-8x7B: 8 experts of width 14,336, 2 per token; its vocabulary has no unused id, so MASK is <unk> (0).
    "mixtral-8x7b": Shape("mixtral-8x7b", _mixtral(32, 4096, 32, 8, 14336, 8, 2), mask_token_id=0),
    # GPT-OSS-20B (its experts bfloat16, as OpenAI's MXFP4 ones load): MASK a reserved id of its vocabulary.
    "gpt-oss-20b": Shape("gpt-oss-20b", _gpt_oss(24, 32), mask_token_id=200017),
    # SmolLM3-3B (MASK a reserved id of its Llama-3 vocabulary, as llama3-8b's) and Phi-4-mini (its padded
    # vocabulary's last row): no public DFlash drafter exists for either; the drafters are z-lab's recipe.
    "smollm3-3b": Shape("smollm3-3b", _smollm3(), mask_token_id=128002),
    "phi4-mini": Shape("phi4-mini", _phi4_mini(), mask_token_id=200063),
    # Gemma 3 1B (MASK its <mask> token, id 4)
    "gemma3-1b": Shape("gemma3-1b", _gemma3_1b(), mask_token_id=4),
    "llama3-8b": Shape("llama3-8b", _llama(32, 4096, 32, 8, 14336, 128256, tie=False, theta=500000.0,
                                           max_pos=8192), mask_token_id=128002),
    # The shipped drafter's shape (treeflash/default_drafter/config.json), not z-lab's five layers: rounds at this
    # size are launch-bound, so the drafter's layer count shows in a round's time.
    "smollm2-135m": Shape("smollm2-135m", _llama(30, 576, 9, 3, 1536, 49152, tie=True, theta=100000.0,
                                                 max_pos=8192), mask_token_id=16, drafter_layers=3,
                          target_layer_ids=(1, 8, 14, 21, 27)),
}


def shape(name: str) -> Shape:
    if name not in SHAPES:
        raise ValueError(f"unknown synthetic shape {name!r}; choose from {', '.join(SHAPES)}")
    return SHAPES[name]


def target_config(s: Shape) -> ModelConfig:
    return ModelConfig.from_hf(s.target)


def drafter_hf_config(target: ModelConfig, layers: int, block_size: int, mask_token_id: int,
                      target_layer_ids: tuple[int, ...] | None = None) -> dict[str, Any]:
    """A z-lab style drafter config.json: Qwen3 layers at the target's width; target layer ids spread over
    the target unless given."""
    dflash: dict[str, Any] = {"mask_token_id": mask_token_id}
    if target_layer_ids is not None:
        dflash["target_layer_ids"] = list(target_layer_ids)
    return {
        "architectures": ["DFlashDraftModel"], "model_type": "qwen3", "block_size": block_size,
        "dflash_config": dflash, "num_target_layers": target.num_layers,
        "vocab_size": target.vocab_size, "hidden_size": target.hidden_size,
        "intermediate_size": target.intermediate_size, "num_hidden_layers": layers,
        "num_attention_heads": target.num_heads, "num_key_value_heads": target.num_kv_heads,
        "head_dim": target.head_dim, "rms_norm_eps": target.rms_norm_eps, "rope_theta": target.rope.theta,
        "max_position_embeddings": target.max_position_embeddings,
    }


def drafter_config(target: ModelConfig, layers: int = 5, block_size: int = 16, mask_token_id: int | None = None,
                   target_layer_ids: tuple[int, ...] | None = None) -> DrafterConfig:
    mask = target.vocab_size - 1 if mask_token_id is None else mask_token_id
    return DrafterConfig.from_hf(drafter_hf_config(target, layers, block_size, mask, target_layer_ids))


# --- parameter arithmetic (no allocation) ------------------------------------------------------------
def _layer_params(c: ModelConfig) -> int:
    q, kv = c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim
    attention = c.hidden_size * (2 * q + 2 * kv)  # q, k, v, o projections
    if c.qkv_bias:
        attention += q + 2 * kv
    if c.o_bias:
        attention += c.hidden_size
    if c.qk_norm:
        attention += 2 * c.head_dim
    if c.attention_sinks:
        attention += c.num_heads
    mlp = 3 * c.hidden_size * c.intermediate_size + (2 * c.intermediate_size + c.hidden_size if c.mlp_bias else 0)
    return attention + mlp + (4 if c.sandwich_norms else 2) * c.hidden_size  # + the RMSNorms


def _experts_params(c: ModelConfig, experts: int) -> int:
    """What a mixture-of-experts layer holds beyond the attention and norms, counting `experts` experts."""
    e = c.experts
    shared = 3 * c.hidden_size * e.shared_intermediate_size + c.hidden_size if e.shared_intermediate_size else 0
    biases = e.count + experts * (2 * e.intermediate_size + c.hidden_size) if e.bias else 0  # router's, experts'
    return c.hidden_size * e.count + experts * 3 * c.hidden_size * e.intermediate_size + shared + biases


def target_params(c: ModelConfig, active: bool = False) -> int:
    """Parameters of the target decoder (embedding, layers, final norm, output head unless tied); `active`: of a
    mixture of experts, only the experts one token uses (its per_token of each sparse layer's)."""
    embedding = c.vocab_size * c.hidden_size
    layers = c.num_layers * _layer_params(c)
    if c.experts is not None:
        dense_mlp = _layer_params(c) - _layer_params(replace(c, intermediate_size=0))
        used = c.experts.per_token if active else c.experts.count
        layers += len(c.experts.sparse_layers) * (_experts_params(c, used) - dense_mlp)
    return embedding * (1 if c.tie_word_embeddings else 2) + layers + c.hidden_size


def drafter_params(d: DrafterConfig) -> int:
    """Parameters of a DFlash drafter: fc, hidden_norm, its layers and final norm (no embedding or head)."""
    c = d.layers
    return len(d.target_layer_ids) * c.hidden_size ** 2 + c.hidden_size + c.num_layers * _layer_params(c) + c.hidden_size


# --- building on the device ----------------------------------------------------------------------------
def _randomize(module: torch.nn.Module, std: float, seed: int) -> None:
    gen = torch.Generator(device=next(module.parameters()).device).manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            if "norm" in name:
                p.fill_(1.0)
            else:
                p.normal_(0.0, std, generator=gen)


def _materialize(module, rope, head_dim, device, dtype, std, seed):
    """Move a meta-built module to `device` in `dtype` and fill it; "meta" stays unallocated."""
    module = module.to(dtype)
    if torch.device(device).type == "meta":
        return module.eval()
    module = module.to_empty(device=device)
    module.rotary = Rotary(rope, head_dim).to(device)  # to_empty leaves the frequency buffer unset
    if getattr(module, "local_rotary", None) is not None:  # (Gemma 3's sliding layers')
        module.local_rotary = Rotary(module.config.local_rope, head_dim).to(device)
    _randomize(module, std, seed)
    stack_experts(module)
    return module.eval()


def build_target(c: ModelConfig, device: str | torch.device, dtype: torch.dtype, seed: int = 0,
                 std: float = 0.02, shard=None) -> Transformer:
    """A target decoder with random weights (normal(0, std), norms 1), allocated once, on the device.

    shard: a tensor-parallel rank (`models/parallel.py: Shard`): only the rank's decoder is built. Every
    rank draws from the same seed in the same order, so the replicated weights (embedding, norms, head)
    are the same on every rank, as the ranks' lockstep needs."""
    with torch.device("meta"):
        model = Transformer(c) if shard is None else shard.build(c)
    return _materialize(model, c.rope, c.head_dim, device, dtype, std, seed)


def build_drafter(d: DrafterConfig, device: str | torch.device, dtype: torch.dtype, seed: int = 1,
                  std: float = 0.02) -> DFlashDrafter:
    with torch.device("meta"):
        drafter = DFlashDrafter(d)
    return _materialize(drafter, d.layers.rope, d.layers.head_dim, device, dtype, std, seed)


def weight_bytes(module: torch.nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in module.parameters())


def decode_read_bytes(module: torch.nn.Module) -> int:
    """The weight bytes one token's decode step reads at least: every weight, except the experts a token does
    not use (all but per_token of each mixture-of-experts layer's)."""
    unused = 0
    for m in module.modules():
        if isinstance(m, SparseMoE):
            unused += (m.config.count - m.config.per_token) * weight_bytes(m.experts[0])
    return weight_bytes(module) - unused
