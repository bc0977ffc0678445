"""The target decoder: Llama / Qwen2 / Qwen3 in one implementation.

One forward takes new tokens with arbitrary positions, writes their K/V at given cache rows and lets
each attend to the cache through an arbitrary visibility mask. A prompt (causal mask), one decode
step and a whole draft tree (ancestor-only mask, depth positions) are all the same call.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from treeflash.config import ModelConfig
from treeflash.kv_cache import KVCache, PrefixKV
from treeflash.models.layers import MLP, RMSNorm, Rotary, apply_rotary, attend


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        self.q_proj = nn.Linear(cfg.hidden_size, cfg.num_heads * cfg.head_dim, bias=cfg.qkv_bias)
        self.k_proj = nn.Linear(cfg.hidden_size, cfg.num_kv_heads * cfg.head_dim, bias=cfg.qkv_bias)
        self.v_proj = nn.Linear(cfg.hidden_size, cfg.num_kv_heads * cfg.head_dim, bias=cfg.qkv_bias)
        self.o_proj = nn.Linear(cfg.num_heads * cfg.head_dim, cfg.hidden_size, bias=cfg.o_bias)
        if cfg.qk_norm:
            self.q_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps)
            self.k_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps)
        else:
            self.q_norm = self.k_norm = None

    def project_kv(self, x, cos, sin) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys (normed, rotated) and values of x: [B, T, hidden] -> two [B, Hkv, T, D]."""
        b, t, _ = x.shape
        k = self.k_proj(x).view(b, t, self.num_kv_heads, self.head_dim)
        v = self.v_proj(x).view(b, t, self.num_kv_heads, self.head_dim)
        if self.k_norm is not None:
            k = self.k_norm(k)
        return apply_rotary(k.transpose(1, 2), cos, sin), v.transpose(1, 2)

    def forward(self, x, cos, sin, cache: KVCache | PrefixKV, layer: int, rows, mask):
        # x: [B, T, hidden]; rows: [B, T] (cache rows; unused with a PrefixKV); mask: [B, T, L]
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, self.num_heads, self.head_dim)
        if self.q_norm is not None:
            q = self.q_norm(q)
        q = apply_rotary(q.transpose(1, 2), cos, sin)
        k, v = self.project_kv(x, cos, sin)
        keys, values = cache.extend(layer, k, v, rows, mask.shape[-1])
        return self.o_proj(attend(q, keys, values, mask))


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.self_attn = Attention(cfg)
        self.mlp = MLP(cfg.hidden_size, cfg.intermediate_size, cfg.mlp_bias)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, x, cos, sin, cache, layer, rows, mask):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, cache, layer, rows, mask)
        return x + self.mlp(self.post_attention_layernorm(x))


class Transformer(nn.Module):
    """Parameter names follow the HF checkpoints with the leading `model.` dropped."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.config = cfg
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.lm_head = None if cfg.tie_word_embeddings else nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        self.rotary = Rotary(cfg.rope, cfg.head_dim)

    @property
    def output_weight(self) -> torch.Tensor:
        return self.embed_tokens.weight if self.lm_head is None else self.lm_head.weight

    def forward(self, tokens: torch.Tensor, positions: torch.Tensor, cache: KVCache | PrefixKV, rows: torch.Tensor | None,
                mask: torch.Tensor, capture_layers: tuple[int, ...] = ()) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """tokens, positions, rows: [B, T]; mask: [B, T, L] over cache rows 0..L-1 (True = visible).

        With a `PrefixKV` nothing is cached (training): the mask covers the prefix and the new tokens.

        Returns the final-normed hidden states [B, T, hidden] and the outputs of the decoder layers
        listed in `capture_layers` (HF `hidden_states[i + 1]`), which condition the drafter.
        """
        x = self.embed_tokens(tokens)
        cos, sin = self.rotary(positions, x.dtype)
        captured = {}
        for i, layer in enumerate(self.layers):
            x = layer(x, cos, sin, cache, i, rows, mask)
            if i in capture_layers:
                captured[i] = x
        return self.norm(x), [captured[i] for i in capture_layers]

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return F.linear(hidden, self.output_weight).float()

    def new_cache(self, slots: int, capacity: int) -> KVCache:
        p = self.embed_tokens.weight
        c = self.config
        return KVCache.allocate(c.num_layers, slots, c.num_kv_heads, capacity, c.head_dim, p.dtype, p.device)
