"""The target decoder: Llama / Mistral / Qwen2 / Qwen3 / SmolLM3 / Phi-3 / Gemma 3 (and the mixtures of experts
Qwen2-MoE, Qwen3-MoE, Mixtral and GPT-OSS) in one implementation.

One forward takes new tokens with arbitrary positions, writes their K/V at given cache rows and lets
each attend to the cache through an arbitrary visibility mask. A prompt (causal mask), one decode
step and a whole draft tree (ancestor-only mask, depth positions) are all the same call. Layers with a
sliding window take the round's mask narrowed to their window (`attention.windowed`), made once a forward.
"""

from __future__ import annotations

import torch
from torch import nn

from treeflash.attention import attend_new, windowed
from treeflash.config import ModelConfig
from treeflash.kv_cache import KVCache, PrefixKV
from treeflash.models.kernels import EAGER, Kernels, Linear, linear
from treeflash.models.layers import MLP, RMSNorm, Rotary, SparseMoE


class Attention(nn.Module):
    kernels: Kernels = EAGER  # the pieces the forward calls (models/kernels.py: use_fast_path)
    qkv: tuple[torch.Tensor, torch.Tensor | None] | None = None  # fused weight, bias (models/kernels.py)
    use_fused: bool = False

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        # GPT-OSS: one logit per query head that joins every softmax's sum and weighs no value
        self.sinks = nn.Parameter(torch.zeros(cfg.num_heads)) if cfg.attention_sinks else None
        self.q_proj = Linear(cfg.hidden_size, cfg.num_heads * cfg.head_dim, bias=cfg.qkv_bias)
        self.k_proj = Linear(cfg.hidden_size, cfg.num_kv_heads * cfg.head_dim, bias=cfg.qkv_bias)
        self.v_proj = Linear(cfg.hidden_size, cfg.num_kv_heads * cfg.head_dim, bias=cfg.qkv_bias)
        self.o_proj = Linear(cfg.num_heads * cfg.head_dim, cfg.hidden_size, bias=cfg.o_bias)
        if cfg.qk_norm:
            self.q_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps, cfg.norm_offset)
            self.k_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps, cfg.norm_offset)
        else:
            self.q_norm = self.k_norm = None

    def _norm_rotary(self, x, norm: RMSNorm | None, cos, sin) -> torch.Tensor:
        # x: [B, T, H * D] -> [B, H, T, D], per-head normed (Qwen3) and rotated
        b, t, _ = x.shape
        x = x.view(b, t, -1, self.head_dim)
        if norm is None:
            return self.kernels.norm_rotary(x, None, 0.0, cos, sin)
        return self.kernels.norm_rotary(x, norm.weight, norm.eps, cos, sin, norm.offset)

    def _kv(self, x, k, v, cos, sin) -> tuple[torch.Tensor, torch.Tensor]:
        b, t, _ = x.shape
        return self._norm_rotary(k, self.k_norm, cos, sin), v.view(b, t, -1, self.head_dim).transpose(1, 2)

    def project_kv(self, x, cos, sin) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys (normed, rotated) and values of x: [B, T, hidden] -> two [B, Hkv, T, D]."""
        if self.use_fused and not torch.is_grad_enabled():  # fused weights carry no gradient
            weight, bias = self.qkv
            q_rows = self.num_heads * self.head_dim  # k and v are the fused weight's last rows: one GEMM
            k, v = linear(x, weight[q_rows:], None if bias is None else bias[q_rows:]).chunk(2, dim=-1)
        else:
            k, v = self.k_proj(x), self.v_proj(x)
        return self._kv(x, k, v, cos, sin)

    def forward(self, x, cos, sin, cache: KVCache | PrefixKV, layer: int, rows, mask):
        # x: [B, T, hidden]; rows: [B, T] (cache rows; unused with a PrefixKV); mask: [B, T, L]
        if self.use_fused and not torch.is_grad_enabled():  # fused weights carry no gradient
            # q's and k's heads are adjacent in the one GEMM's output (Kernels.qk_norm_rotary).
            b, t, _ = x.shape
            qk_width = (self.num_heads + self.num_kv_heads) * self.head_dim
            qk, v = linear(x, *self.qkv).split([qk_width, self.num_kv_heads * self.head_dim], dim=-1)
            q_norm, k_norm = self.q_norm, self.k_norm
            q, k = self.kernels.qk_norm_rotary(
                qk.view(b, t, -1, self.head_dim), None if q_norm is None else q_norm.weight,
                None if k_norm is None else k_norm.weight, 0.0 if q_norm is None else q_norm.eps, cos, sin,
                self.num_heads, q_norm is not None and q_norm.offset)
            v = v.view(b, t, -1, self.head_dim).transpose(1, 2)
        else:
            q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
            q = self._norm_rotary(q, self.q_norm, cos, sin)
            k, v = self._kv(x, k, v, cos, sin)
        return self.o_proj(attend_new(q, k, v, cache, layer, rows, mask, self.sinks))


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, index: int = 0):
        super().__init__()
        self.self_attn = Attention(cfg)
        experts = cfg.experts
        self.mlp = (SparseMoE(cfg.hidden_size, experts) if experts is not None and index in experts.sparse_layers
                    else MLP(cfg.hidden_size, cfg.intermediate_size, cfg.mlp_bias, cfg.activation))
        norm = (cfg.hidden_size, cfg.rms_norm_eps, cfg.norm_offset)
        self.input_layernorm = RMSNorm(*norm)
        self.post_attention_layernorm = RMSNorm(*norm)
        if cfg.sandwich_norms:
            # Gemma (its names): post_attention_layernorm norms the attention's output, pre_feedforward_layernorm
            # the MLP's input, post_feedforward_layernorm its output
            self.pre_feedforward_layernorm = RMSNorm(*norm)
            self.post_feedforward_layernorm = RMSNorm(*norm)
        self.sandwich = cfg.sandwich_norms

    def forward(self, x, delta, cos, sin, cache, layer, rows, mask):
        """x + delta: this layer's input [B, T, hidden], delta the previous layer's MLP output not yet added
        to the residual (None for the first layer): each residual sum is made by the kernel of the norm
        after it. Returns the input (HF's hidden state before this layer), the residual after attention,
        and this layer's MLP output (the next layer's delta)."""
        x, h = self.input_layernorm.add(x, delta)
        attn = self.self_attn(h, cos, sin, cache, layer, rows, mask)
        if self.sandwich:
            mid, h = self.pre_feedforward_layernorm.add(x, self.post_attention_layernorm(attn))
            return x, mid, self.post_feedforward_layernorm(self.mlp(h))
        mid, h = self.post_attention_layernorm.add(x, attn)
        return x, mid, self.mlp(h)


def run_layers(layers: nn.ModuleList, norm: RMSNorm, x, cos, sin, cache, rows, mask,
               capture_layers: tuple[int, ...] = ()) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """A decoder stack over x [B, T, hidden]: the final-normed hidden states and the outputs of the layers
    in `capture_layers` (HF `hidden_states[i + 1]`). `mask` is every layer's, or a list of one per layer. A
    layer's last residual sum happens in the next norm's kernel (`DecoderLayer.forward`): one launch per layer
    fewer; eagerly the same values, bit for bit (tests/test_kernels.py), compiled whatever Inductor's fused
    add + norm rounds. `cos` and `sin` too may be one per layer (a tuple)."""
    delta, captured = None, {}
    for i, layer in enumerate(layers):
        layer_mask = mask[i] if isinstance(mask, list) else mask
        layer_cos, layer_sin = (cos[i], sin[i]) if isinstance(cos, tuple) else (cos, sin)
        layer_input, x, delta = layer(x, delta, layer_cos, layer_sin, cache, i, rows, layer_mask)
        if i - 1 in capture_layers:
            captured[i - 1] = layer_input
    out, normed = norm.add(x, delta)
    if len(layers) - 1 in capture_layers:
        captured[len(layers) - 1] = out
    return normed, [captured[i] for i in capture_layers]


class Transformer(nn.Module):
    """Parameter names follow the HF checkpoints with the leading `model.` dropped."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.config = cfg
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg, i) for i in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, cfg.norm_offset)
        self.lm_head = None if cfg.tie_word_embeddings else Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        self.rotary = Rotary(cfg.rope, cfg.head_dim)
        # Gemma 3: its sliding layers' RoPE
        self.local_rotary = None if cfg.local_rope is None else Rotary(cfg.local_rope, cfg.head_dim)

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
        x = self.embed(tokens)
        cos, sin = self.rotary(positions, x.dtype)
        c = self.config
        if c.window_layers:
            narrow = windowed(mask, positions, rows, c.sliding_window)
            mask = [narrow if i in c.window_layers else mask for i in range(c.num_layers)]
        if c.nope_layers or self.local_rotary is not None:
            # A NoPE layer's tables rotate by nothing: x * 1 + rotate_half(x) * 0 is x, bit for bit, so its
            # queries and keys go through the same (fused) kernels as the other layers'.
            still = (torch.ones_like(cos), torch.zeros_like(sin)) if c.nope_layers else None
            local = None if self.local_rotary is None else self.local_rotary(positions, x.dtype)
            per_layer = [still if i in c.nope_layers else local if i in c.local_rope_layers else (cos, sin)
                         for i in range(c.num_layers)]
            cos, sin = zip(*per_layer)
        return run_layers(self.layers, self.norm, x, cos, sin, cache, rows, mask, capture_layers)

    def embed(self, tokens: torch.Tensor) -> torch.Tensor:
        """The input embeddings of tokens (Gemma's times sqrt(hidden_size), the scale rounded to the weights'
        dtype as transformers rounds it)."""
        x = self.embed_tokens(tokens)
        if self.config.embed_scale is None:
            return x
        # (a host scalar: a graph's capture keeps its value, and no copy to the device is made)
        return x * torch.tensor(self.config.embed_scale, dtype=x.dtype, device="cpu")

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """The lm_head over hidden states [..., H] -> logits [..., V] in the weights' dtype: greedy takes their
        argmax as they are (a float32 copy has the same one, and with the drafter's was 35 us of copies in a
        bf16 Qwen3-8B DDTree-64 round: benchmarks/h200-draft-logprobs); whatever forms a distribution from
        them does it in float32 (`processed_probs`)."""
        return linear(hidden, self.output_weight)

    def new_cache(self, slots: int, capacity: int) -> KVCache:
        p = self.embed_tokens.weight
        c = self.config
        return KVCache.allocate(c.num_layers, slots, c.num_kv_heads, capacity, c.head_dim, p.dtype, p.device)
