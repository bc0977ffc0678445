"""Attention of new tokens over a slot's cache: one `attend`, three ways to say what each token sees.

The new tokens of a round (a draft block, a draft tree, one decode step) see every committed row of
their slot plus the new rows their own mask allows. Three representations of that visibility (and a mix):

- "sdpa": a dense boolean mask [B, T, L] and `scaled_dot_product_attention`. The reference and the CPU
  path (prefill too where the backend is "flex"); on a GPU it reads all L rows of the cache whatever the
  slot's length.
- "flex": a FlexAttention `BlockMask` over 128-row blocks: committed blocks are "full" (no mask
  evaluated), the blocks holding the new rows evaluate the ancestor mask, and blocks past the slot's
  length are skipped, so a round costs what the slot's context costs, not what the cache could hold.
  It runs through a Triton kernel compiled by `torch.compile` (CUDA only; never needed on the CPU).
- "splitkv": the slots' committed lengths and the [B, T, T] mask among the new rows, read by our own
  Triton kernels (treeflash/splitkv_attention.py): each KV head's query heads folded together, the
  visible rows split over many programs and merged. Like flex it reads only the slot's context
  (CUDA only). Prefill runs it too, with "hybrid" as well (`Speculator.prefill_forward`).
- "hybrid": both, chosen per call by its folded query rows: splitkv for few (the AR step, draft blocks,
  small trees; at one slot trees to 128 nodes), flex for many (HybridMask.pick).

FlexAttention has two kernels: a decoding kernel that packs the query rows of one KV head's query heads
(T x groups) into one block and reads each KV row once for all of them, and the general kernel (one
query head's rows per block). Which one a block of T new tokens uses is `flex_decode_tokens`: the
decoding kernel for T <= it and at most FLEX_DECODE_ROWS packed rows, the general one past either.
FLEX_DECODE_TOKENS is the default; the synthetic benchmark times others (`--flex-decode-tokens`).

Sliding-window layers (Mistral, GPT-OSS) take the round's mask narrowed to their window (`windowed`): for
"sdpa" the dense mask itself, for "splitkv" each new token's first visible committed row beside the new rows'
mask (the kernel walks only the rows some token sees). GPT-OSS's attention sinks (a logit per query head
that joins each softmax's sum) go to the splitkv kernels, and on "sdpa" through an explicit softmax. "flex"
and "hybrid" take neither (refused by `check_backend`).

All three are built from device tensors alone (no host synchronisation) with shapes fixed by the cache
capacity, so a round can be captured in a CUDA graph once and replayed at any context length.
Which backend the GPU uses was chosen by measurement: benchmarks/attention/README.md (sdpa vs flex),
benchmarks/h200-splitkv (flex vs splitkv).
"""

from __future__ import annotations

import functools
import inspect
import os
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from treeflash.kv_cache import KVCache, SlotSelection, append_layout

BACKENDS = ("sdpa", "flex", "splitkv", "hybrid")
FLEX_BLOCK = 128  # rows per FlexAttention block (its default sparse block size)
# Keys per block of PyTorch's CPU SDPA kernel from 512 keys on: over a whole number of blocks, a query row's
# output has the same bits however many masked keys follow its last visible one (tests/test_attention_width.py).
SDPA_KV_BLOCK = 512
# When FlexAttention's decoding kernel runs (see the module docstring): for at most FLEX_DECODE_TOKENS
# new tokens per slot AND at most FLEX_DECODE_ROWS packed rows (tokens x query heads per KV head).
# Measured in benchmarks/h200-qwen3-8b-kernels (H200, torch 2.11, 4 query heads per KV head): packed
# rows 4 (AR step), 20, 36 (trees of 5 and 9 nodes) and 64 (the 16-token draft block) are fastest on the
# decoding kernel; at 68 rows (a 17-node tree) it is 5-6.5x slower than the general kernel at batch 8
# and 32. `treeflash bench --synthetic ... --variants compiled/1,compiled/16` times the choices.
FLEX_DECODE_TOKENS = 16
FLEX_DECODE_ROWS = 64
# "hybrid" runs splitkv for calls of at most HYBRID_SLOT_ROWS folded query rows per slot (new tokens x query
# heads per KV head) or HYBRID_SPLITKV_ROWS over the batch, flex past both. Measured at Qwen3-8B's shape on
# the H200 (benchmarks/h200-splitkv-launch): splitkv at `launch_for`'s settings vs flex, one call (us),
# 1 slot x 65 tokens (260 rows) 28.7 vs 38.9, 8 x 16 (64 a slot) 28.0 vs 53.7, 1 x 257 (1,028) 73.8 vs 68.1,
# 8 x 65 (260 a slot, 2,080) 86.6 vs 82.5; whole rounds, 32 slots x 17-node trees 24.95 vs 29.77 ms.
HYBRID_SLOT_ROWS = 128
HYBRID_SPLITKV_ROWS = 512


@dataclass(frozen=True)
class CausalMask:
    """Each of T tokens sees itself and the tokens before it, nothing else: a whole sequence with no cache
    (training's target pass over right-padded sequences). No mask tensor: SDPA's `is_causal` runs a
    FlashAttention kernel, where a dense [B, T, T] mask took a copy per layer for the folded query heads, a
    conversion to an additive mask and, on cuDNN, an attention plan per new length
    (benchmarks/h200-train-step-profile)."""

    batch: int
    length: int

    @property
    def shape(self) -> tuple[int, ...]:
        return (self.batch, self.length, self.length)


@dataclass(frozen=True)
class FlexMask:
    """A round's FlexAttention mask and the kernel choice that goes with it."""

    block_mask: object  # torch.nn.attention.flex_attention.BlockMask
    decode_kernel: bool  # run FlexAttention's decoding kernel (when its packed rows fit)

    @property
    def shape(self) -> tuple[int, ...]:
        return self.block_mask.shape


@dataclass(frozen=True)
class SplitKVMask:
    """A round's mask for the splitkv kernels: committed rows per slot, then who sees whom among the new."""

    seq_lens: torch.Tensor  # [B] int32
    new_mask: torch.Tensor  # [B, T, T] uint8, 1 = visible
    kv_len: int
    first: torch.Tensor | None = None  # [B, T] int32: a sliding window's first committed row each token sees
    window: int | None = None  # that window's width: the kernels size their KV splits to it

    @property
    def shape(self) -> tuple[int, ...]:
        return (*self.new_mask.shape[:2], self.kv_len)


@dataclass(frozen=True)
class HybridMask:
    """A round's masks for both kernels; each call takes one by its folded query rows (`pick`)."""

    flex: FlexMask
    splitkv: SplitKVMask

    @property
    def shape(self) -> tuple[int, ...]:
        return self.flex.shape

    def pick(self, tokens: int, groups: int) -> FlexMask | SplitKVMask:
        """splitkv for at most HYBRID_SLOT_ROWS folded query rows per slot or HYBRID_SPLITKV_ROWS over the
        batch, else flex."""
        rows = tokens * groups
        if rows <= HYBRID_SLOT_ROWS or self.splitkv.new_mask.shape[0] * rows <= HYBRID_SPLITKV_ROWS:
            return self.splitkv
        return self.flex


def default_backend(device: torch.device | str, head_dim: int, flex: bool = True) -> str:
    """The backend a device uses when none is asked for, by measurement (H200): "sdpa" on the CPU; on
    CUDA "splitkv" where its kernels fit the head dimension (SmolLM2's 9/3 heads: rounds 0.52-0.71x flex's,
    benchmarks/h200-splitkv; Qwen3-8B's 32/8: every call measured from the AR step to 32 slots x 257-node
    trees faster than FlexAttention's, whole rounds 0.97-1.00x hybrid's, benchmarks/h200-splitkv-tree),
    "flex" where they do not fit, "sdpa" below FlexAttention's smallest head dimension (16: a tiny test
    model's 8 failed to compile on an H100, benchmarks/gpu-moe/). flex False (a model with sliding windows or
    attention sinks, which FlexAttention's masks here do not take): "sdpa" where splitkv does not fit. Heads
    of 256 (Gemma 3's) are splitkv's too: on an H100 its graphs equal eager and plain decoding, and at the
    Gemma 3 1B shape its AR step takes 0.44x sdpa's time and a DDTree-16 round 0.65x (benchmarks/gpu-new-archs);
    wider ones, never run, are taken as not fitting (attention="splitkv" still asks for them)."""
    if torch.device(device).type != "cuda" or head_dim < FLEX_MIN_HEAD_DIM:
        return "sdpa"
    return "splitkv" if splitkv_fits(head_dim) and head_dim <= 256 else "flex" if flex else "sdpa"


FLEX_MIN_HEAD_DIM = 16  # (Inductor's FlexAttention kernels: "embedding dimension ... must be at least 16")


def splitkv_fits(head_dim: int) -> bool:
    """The splitkv kernels tile the head dimension whole: a power of two, at least 16 (tl.dot's minimum)."""
    return head_dim >= 16 and not head_dim & (head_dim - 1)


def check_backend(backend: str, device: torch.device | str, head_dim: int | None = None, windows: bool = False,
                  sinks: bool = False) -> str:
    """The backend, if it runs this model here (windows / sinks: the model has sliding-window layers /
    attention sinks), else a ValueError saying what to use."""
    if backend not in BACKENDS:
        raise ValueError(f"attention backend must be one of {BACKENDS}, got {backend!r}")
    if backend in ("flex", "hybrid") and (windows or sinks):
        what = "sliding-window attention" if windows else "attention sinks"
        raise ValueError(f"the {backend} attention backend does not run {what} (this model has them); use "
                         f"'splitkv' or 'sdpa'")
    if backend in ("splitkv", "hybrid") and head_dim is not None and not splitkv_fits(head_dim):
        raise ValueError(f"the {backend} attention backend needs a power-of-two head dimension of at least 16; "
                         f"this model's is {head_dim} (use 'flex' or 'sdpa')")
    if backend == "flex" and head_dim is not None and head_dim < FLEX_MIN_HEAD_DIM:
        raise ValueError(f"the flex attention backend needs a head dimension of at least {FLEX_MIN_HEAD_DIM}; "
                         f"this model's is {head_dim} (use 'sdpa')")
    # Triton's interpreter runs the splitkv kernels on CPU tensors (the tests' way to run them here; a
    # hybrid round there must keep to calls that pick splitkv).
    interpreted = backend in ("splitkv", "hybrid") and os.environ.get("TRITON_INTERPRET") == "1"
    if backend != "sdpa" and torch.device(device).type != "cuda" and not interpreted:
        raise ValueError(f"the {backend} attention backend needs a CUDA device (the CPU uses 'sdpa')")
    return backend


def round_layout(seq_lens: torch.Tensor, new_mask: torch.Tensor, kv_len: int, backend: str,
                 flex_decode_tokens: int = FLEX_DECODE_TOKENS):
    """Cache rows of T new tokens and their visibility over cache rows [0, kv_len).

    seq_lens: [B] committed rows; new_mask: [B, T, T] visibility among the new tokens.
    Returns rows [B, T] and a mask for `attend`: a bool tensor [B, T, kv_len] ("sdpa"), a
    FlexMask ("flex"; its kernel chosen by `flex_decode_tokens`), a SplitKVMask ("splitkv") or a
    HybridMask of the last two ("hybrid"); each has `.shape[-1] == kv_len`.
    """
    if backend == "sdpa":
        return append_layout(seq_lens, new_mask, kv_len)
    t = new_mask.shape[1]
    rows = seq_lens[:, None] + torch.arange(t, device=new_mask.device)
    if backend in ("splitkv", "hybrid"):
        # (a bool mask's bytes are 0 / 1 already: viewed as uint8, not copied by another kernel)
        visible = new_mask.view(torch.uint8) if new_mask.dtype == torch.bool else new_mask.to(torch.uint8)
        splitkv = SplitKVMask(seq_lens.to(torch.int32), visible, kv_len)
        if backend == "splitkv":
            return rows, splitkv
    flex = FlexMask(block_mask(seq_lens, new_mask, kv_len), decode_kernel=t <= flex_decode_tokens)
    return rows, HybridMask(flex, splitkv) if backend == "hybrid" else flex


def block_mask(seq_lens: torch.Tensor, new_mask: torch.Tensor, kv_len: int):
    """The BlockMask of `round_layout` (seq_lens + T <= kv_len for every slot)."""
    from torch.nn.attention.flex_attention import BlockMask

    batch, t = new_mask.shape[:2]
    device = new_mask.device
    kv_blocks = -(-kv_len // FLEX_BLOCK)
    q_blocks = -(-t // FLEX_BLOCK)
    seq = seq_lens.to(torch.int32)
    full = seq // FLEX_BLOCK  # blocks wholly committed: visible to every new token
    end = (seq + t + FLEX_BLOCK - 1) // FLEX_BLOCK  # one past the last block holding a new row
    blocks = torch.arange(kv_blocks, dtype=torch.int32, device=device)

    def per_q_block(x: torch.Tensor) -> torch.Tensor:  # [B, ...] -> [B, 1, q_blocks, ...]
        return x[:, None, None].expand(batch, 1, q_blocks, *x.shape[1:]).contiguous()

    partial_indices = (full[:, None] + blocks).clamp_max(kv_blocks - 1)
    seq_lens_, new_mask_ = seq_lens, new_mask

    def mask_mod(b, h, q_idx, kv_idx):
        rel = kv_idx - seq_lens_[b]
        new = new_mask_[b, q_idx.clamp(max=t - 1), rel.clamp(0, t - 1)]
        return (rel < 0) | ((rel < t) & new)

    extra = {"compute_q_blocks": False} if "compute_q_blocks" in _from_kv_blocks_params() else {}
    return BlockMask.from_kv_blocks(
        per_q_block(end - full), per_q_block(partial_indices),
        per_q_block(full), per_q_block(blocks.expand(batch, kv_blocks)),
        BLOCK_SIZE=FLEX_BLOCK, mask_mod=mask_mod, seq_lengths=(t, kv_len), **extra)


@functools.cache
def _from_kv_blocks_params() -> frozenset[str]:
    from torch.nn.attention.flex_attention import BlockMask

    return frozenset(inspect.signature(BlockMask.from_kv_blocks).parameters)


@functools.cache
def _compiled_flex():
    # Compiled once per process, lazily: importing treeflash never compiles anything.
    from torch.nn.attention.flex_attention import flex_attention

    return torch.compile(flex_attention, dynamic=False)


def windowed(mask, positions: torch.Tensor, rows: torch.Tensor | None, window: int):
    """`mask` (any of `round_layout`'s, or a CausalMask) narrowed to a sliding window: a new token at position p
    sees only positions p - window + 1 .. p of what the mask lets it see (transformers' sliding-window mask).
    positions, rows: [B, T], the new tokens' positions and cache rows (None: training's sequences, where a
    column's index is its position). A committed row's position is its row, as the engine caches them."""
    near = positions[:, :, None] - positions[:, None, :]  # [B, T, T]: how far back each new token is
    if isinstance(mask, CausalMask):
        causal = torch.ones(mask.length, mask.length, dtype=torch.bool, device=positions.device).tril()
        return (causal & (near < window))[:, None]  # [B, 1, T, T], the same for every head
    if isinstance(mask, SplitKVMask):
        first = (positions - (window - 1)).clamp_min(0).to(torch.int32)
        new_mask = ((mask.new_mask != 0) & (near < window)).to(torch.uint8)
        return SplitKVMask(mask.seq_lens, new_mask, mask.kv_len, first, window)
    if isinstance(mask, torch.Tensor) and mask.dim() == 3:
        batch, length = mask.shape[0], mask.shape[-1]
        cols = torch.arange(length, device=mask.device).expand(batch, length)
        if rows is not None:  # the new rows' positions are their tokens', not their rows'
            cols = cols.scatter(1, rows, positions)
        return mask & (cols[:, None, :] > positions[:, :, None] - window)
    raise ValueError(f"no sliding window for a {type(mask).__name__} (use the 'splitkv' or 'sdpa' backend)")


def attend_new(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cache, layer: int, rows: torch.Tensor,
               mask, sinks: torch.Tensor | None = None) -> torch.Tensor:
    """New tokens (queries q [B, H, T, D], keys and values k, v [B, Hkv, T, D]) stored in `cache` at
    `rows`, then attending over it (`attend`) -> [B, T, H*D]. With a SplitKVMask over a KVCache the
    splitkv kernels do both in one launch (the new rows read from k, v and stored as they go): two
    scatter kernels fewer per layer (benchmarks/h200-splitkv). A prefill's pieces (a SlotSelection of
    any slots, every new token stored) go the same way, the kernels told each piece's slot: no gathered
    copy of the slots' rows, no dense mask (benchmarks/admission)."""
    if isinstance(mask, HybridMask):
        mask = mask.pick(q.shape[2], q.shape[1] // k.shape[1])
    if isinstance(mask, SplitKVMask) and (isinstance(cache, KVCache) or (
            isinstance(cache, SlotSelection) and cache.real is None)):
        from treeflash.splitkv_attention import splitkv_attention

        whole, slots = (cache, None) if isinstance(cache, KVCache) else (cache.cache, cache.slots)
        return splitkv_attention(q, whole.keys[layer][:, :, :mask.kv_len], whole.values[layer][:, :, :mask.kv_len],
                                 mask.seq_lens, mask.new_mask, k, v, slots=slots, first=mask.first, sinks=sinks,
                                 window=mask.window)
    keys, values = cache.extend(layer, k, v, rows, mask.shape[-1])
    return attend(q, keys, values, mask, sinks)


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask, sinks: torch.Tensor | None = None
           ) -> torch.Tensor:
    """q: [B, H, T, D]; k, v: [B, Hkv, L, D]; mask: [B, T, L] bool (True = visible), [B, 1, T, L] bool (the
    same for every head: training's many-block mask), a CausalMask (T = L), or a FlexMask or SplitKVMask (or
    a HybridMask of both) over the same rows; sinks: [H], GPT-OSS's sink logits, or None -> [B, T, H*D]."""
    b, h, t, d = q.shape
    if sinks is not None and not isinstance(mask, (SplitKVMask, HybridMask, FlexMask)):
        return _attend_with_sinks(q, k, v, mask, sinks)
    if isinstance(mask, CausalMask) or (isinstance(mask, torch.Tensor) and mask.dim() == 4):
        # Training's large masks: the KV heads repeated for their query heads (a small copy of [B, Hkv, L, D])
        # rather than the mask copied for every folded query row as below (for a 512-token block over a
        # 400-token context, 9 query heads, 64 sequences: 270 MB a layer, and its additive form).
        groups = h // k.shape[1]
        if groups > 1:
            k, v = k.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1)
        causal = isinstance(mask, CausalMask)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=None if causal else mask, is_causal=causal)
        return out.transpose(1, 2).flatten(2)
    if isinstance(mask, HybridMask):
        mask = mask.pick(t, h // k.shape[1])
    if isinstance(mask, SplitKVMask):
        from treeflash.splitkv_attention import splitkv_attention

        return splitkv_attention(q, k, v, mask.seq_lens, mask.new_mask, first=mask.first, sinks=sinks,
                                 window=mask.window)
    if sinks is not None:
        raise ValueError("attention sinks need the 'splitkv' or 'sdpa' backend")
    if isinstance(mask, FlexMask):
        # The decoding kernel packs the query rows of one KV head (t x groups) into one block; past
        # FLEX_DECODE_ROWS it turns slow (measured), past FLEX_BLOCK it has no valid configuration.
        decode = mask.decode_kernel and t * (h // k.shape[1]) <= FLEX_DECODE_ROWS
        options = None if decode else {"FORCE_USE_FLEX_ATTENTION": True}
        # Shapes here are few (batch bucket x new tokens x capacity): let each get its own kernel.
        with torch._dynamo.config.patch(recompile_limit=256, accumulated_recompile_limit=4096):
            out = _compiled_flex()(q, k, v, block_mask=mask.block_mask, enable_gqa=True, kernel_options=options)
        return out.transpose(1, 2).flatten(2)
    kv_heads, length = k.shape[1], k.shape[2]
    groups = h // kv_heads
    # Fold each KV head's query heads into the query axis: the cache is read in place, never copied
    # per head (SDPA's enable_gqa path is slow on CPU).
    q = q.reshape(b, kv_heads, groups * t, d)
    mask = mask[:, None, None].expand(b, kv_heads, groups, t, length).reshape(b, kv_heads, groups * t, length)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    return out.reshape(b, h, t, d).transpose(1, 2).flatten(2)


def _attend_with_sinks(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask, sinks: torch.Tensor) -> torch.Tensor:
    """`attend` for a dense mask or a CausalMask with GPT-OSS's sinks: SDPA has no term for them, so the softmax
    is written out, in float32, over each row's visible scores and its head's sink logit (which weighs no
    value). Its scores are a [B, H, T, L] tensor: the CPU's and the tests' path, not a fast one."""
    b, h, t, d = q.shape
    kv_heads, length = k.shape[1], k.shape[2]
    groups = h // kv_heads
    if isinstance(mask, CausalMask):
        visible = torch.ones(t, length, dtype=torch.bool, device=q.device).tril()[None, None, None]
    elif mask.dim() == 4:
        visible = mask[:, :, None]  # [B, 1, 1, T, L]: every head alike
    else:
        visible = mask[:, None, None]  # [B, 1, 1, T, L]
    q = q.float().view(b, kv_heads, groups, t, d)
    scores = torch.einsum("bkgtd,bkld->bkgtl", q, k.float()) * d ** -0.5
    scores = scores.masked_fill(~visible, float("-inf"))
    sink = sinks.float().view(1, kv_heads, groups, 1, 1).expand(b, kv_heads, groups, t, 1)
    probs = torch.softmax(torch.cat([scores, sink], dim=-1), dim=-1)[..., :-1]
    out = torch.einsum("bkgtl,bkld->bkgtd", probs, v.float()).to(v.dtype)
    return out.reshape(b, h, t, d).transpose(1, 2).flatten(2)
