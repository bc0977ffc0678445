"""Split-KV attention of a few new tokens (a decode step, a draft block, a draft tree) over a slot's cache.

The `"splitkv"` attention backend (treeflash/attention.py). A round's new tokens sit at rows
[seq_len, seq_len + T) of their slot's cache; each sees every committed row plus the new rows its
[T, T] mask allows (the ancestor mask of a tree). Two Triton kernels:

1. partial: one program per (slot x KV head, block of query rows, KV split). The query rows of one KV
   head's query heads are folded together (G x T rows: the KV rows are read once for all of them),
   and the slot's visible rows [0, seq_len + T) are cut into NUM_SPLITS equal ranges, sized on the
   device from seq_len, so every split has work whatever the context and nothing past it is read.
   Each program keeps an online softmax over its range (running max, sum, weighted values). Given
   the new tokens' keys and values, it reads the new rows from them and one program per (slot, KV
   head) stores them in the cache (no separate cache write, and no program reads another's store).
2. merge: combines the splits' partial results (log-sum-exp weights) into the output.

Sliding-window layers (Mistral v0.1, GPT-OSS) give each new token the first committed row it may see
(`first`): a row block walks only from its rows' smallest first (aligned down to a KV step), so a
128-row window costs about 128 rows whatever the context; its splits cut that range instead, as many as
the window's width would get (`window`), not the cache's capacity. GPT-OSS's attention sinks (`sinks`, a
logit per query head) add a term to each row's softmax denominator and nothing to its values; it is
counted once, where the output is normalised. Both are compile-time flags: layers
without them run the kernel as it was.

With one split the partial kernel normalises and writes the output itself. NUM_SPLITS is fixed per
(batch, T, capacity) call shape, so a round is still one CUDA graph replayed at any context length:
it is chosen to give about the launch's programs per SM (`num_splits`: two, one for a slot's tree; the
launch per call shape is `launch_for`'s). Why not FlexAttention, measured in benchmarks/h200-splitkv and
benchmarks/h200-splitkv-tree: its general kernel runs one program per (query head, 128 query rows), so a
SmolLM2 tree (9 heads, 65 rows) got 9 programs walking the whole context, and its decoding kernel needs a
power-of-two grouping of query heads; at Qwen3-8B's shape every call measured is faster here.
Imported lazily (CUDA only); under TRITON_INTERPRET=1 the same kernels run on CPU tensors (tests).
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

BLOCK_N = 64  # KV rows per inner step
MAX_BLOCK_M = 64  # folded query rows per program
MAX_SPLITS = 64
# Rows a merge program takes: as many as fit MERGE_TILE elements of its [splits, rows, head_dim] tile (at least
# one). Fewer rows a program, more programs: on the H200 every call measured was faster at 1,024 than at 8,192
# (Qwen3-8B: AR step 8.2 vs 9.2 us, 65-node tree 22.8 vs 28.5, 8 AR slots 14.8 vs 20.6; SmolLM2 AR 7.0 vs 9.6)
# with 2,048 and 4,096 in between (benchmarks/h200-splitkv-splits/tiles_ab.txt).
MERGE_TILE = 1024


@dataclass(frozen=True)
class Launch:
    """How the partial kernel is cut and run. The defaults were measured at SmolLM2's shape (head_dim
    64); benchmarks/splitkv_ab.py times others against them and FlexAttention, shape by shape."""

    max_block_m: int = MAX_BLOCK_M  # folded query rows per program, at most (a power of two >= 16)
    block_n: int = BLOCK_N  # KV rows per inner step (a power of two >= 16)
    num_warps: int = 4
    num_stages: int | None = None  # None: Triton's default
    programs_per_sm: int = 2  # the grid `num_splits` aims at


DEFAULT_LAUNCH = Launch()
# At head_dim 128 the [rows, 128] float32 accumulator wants narrower KV steps for few rows: on the H200 at
# Qwen3-8B's shape, 9.5 vs 10.6 us (AR step) against DEFAULT_LAUNCH (benchmarks/h200-splitkv-launch/skv_ab.json).
# One slot's tree wants wide KV steps, four warps, two pipeline stages and about one program per SM: with whole
# KV tiles unmasked, 65 new tokens (260 folded rows) 18.4 us in 64-row blocks (2 splits) against 23.0 at the
# launch before (8 warps, Triton's default stages, 4 splits); 257 (1,028 rows) 43.7 us in 32-row blocks (1
# split) against 57.1 in 64-row ones and 68.6 on FlexAttention. Past 512 rows over a batch the grid has programs
# enough and the few-rows launch is best (8 x 65: 72.8 against 77.3 us; 32 x 17: 83.5 against 120.2). At
# head_dim 64 the default was best or within 8% everywhere. benchmarks/h200-splitkv-tree.
FEW_ROWS_WIDE_HEADS = Launch(block_n=32)
MANY_ROWS_WIDE_HEADS = Launch(max_block_m=64, block_n=128, num_warps=4, num_stages=2, programs_per_sm=1)
MOST_ROWS_WIDE_HEADS = Launch(max_block_m=32, block_n=128, num_warps=4, num_stages=2, programs_per_sm=1)


def launch_for(head_dim: int, rows: int, itemsize: int = 2, batch: int = 1) -> Launch:
    """The launch measured best for `rows` folded query rows a slot (query heads per KV head x new tokens) over
    `batch` slots, in 16-bit elements at head_dim <= 128; for wider elements (float32) or heads (Gemma 3's 256) KV
    steps as much narrower, so the tiles' shared memory stays as measured (a float32 [128, 128] K and V tile,
    double-buffered, would not fit an H200 SM's; nor would a bfloat16 [128, 256] one)."""
    if head_dim < 128:
        launch = DEFAULT_LAUNCH
    elif rows <= MAX_BLOCK_M or (batch > 1 and batch * rows > 512):
        launch = FEW_ROWS_WIDE_HEADS
    else:
        launch = MANY_ROWS_WIDE_HEADS if rows <= 512 else MOST_ROWS_WIDE_HEADS
    wider = max(1, itemsize // 2) * max(1, head_dim // 128)
    if wider == 1:
        return launch
    return dataclasses.replace(launch, block_n=max(16, launch.block_n // wider))


@triton.jit
def _softmax_step(s, m_i, l_i):
    # One tile of the online softmax, scores s in log2 units: (p, alpha, new max, new sum). A row that has
    # seen nothing visible yet (max -inf, only in a tree's new rows) takes 0 as its max, so no exp2 of
    # -inf - -inf.
    m_new = tl.maximum(m_i, tl.max(s, 1))
    m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
    p = tl.exp2(s - m_use[:, None])
    alpha = tl.exp2(m_i - m_use)
    return p, alpha, m_new, l_i * alpha + tl.sum(p, 1)


@triton.jit
def _sink_term(Sinks, head, ok, m):
    # A sink's share of the denominator, in the units of sums taken against max m (log2 units; a row
    # that saw nothing has max -inf, sums against 0, and nothing to divide: 0 out either way).
    sink = tl.load(Sinks + head, mask=ok, other=0.0) * 1.4426950408889634
    return tl.exp2(sink - tl.where(m == float("-inf"), 0.0, m))


@triton.jit
def _partial(Q, K, V, NewK, NewV, SeqLens, NewMask, Slots, First, Sinks, Out, PartAcc, PartMax, PartSum,
             sq_b, sq_h, sq_t, sk_b, sk_h, sk_n, sv_b, sv_h, sv_n, snk_b, snk_h, snk_t, snv_b, snv_h, snv_t,
             sm_b, sm_q, sm_k, sf_b, sf_t, so_b, so_t, scale, KV_HEADS, GROUPS, T, ROWS,
             NUM_SPLITS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr,
             PRECISION: tl.constexpr, STORE_NEW: tl.constexpr, HAS_SLOTS: tl.constexpr,
             HAS_WINDOW: tl.constexpr, HAS_SINKS: tl.constexpr):
    bh = tl.program_id(0)
    m_block = tl.program_id(1)
    split = tl.program_id(2)
    b = bh // KV_HEADS
    h = bh % KV_HEADS
    seq = tl.load(SeqLens + b)
    end = seq + T  # rows [lo, end) are visible to someone

    rows = m_block * BLOCK_M + tl.arange(0, BLOCK_M)  # folded row r = g * T + t
    row_ok = rows < ROWS
    g = rows // T
    t = rows % T
    if HAS_WINDOW:
        # Every split of this row block derives the same range from the same rows, so the merge sees one
        # cut; padding rows see nothing committed and do not pull it down.
        first = tl.where(row_ok, tl.load(First + b * sf_b + t * sf_t, mask=row_ok, other=0), seq)
        lo = tl.min(first, 0) // BLOCK_N * BLOCK_N
    else:
        lo = 0
    per_split = tl.cdiv(tl.cdiv(end - lo, NUM_SPLITS), BLOCK_N) * BLOCK_N
    start = lo + split * per_split
    stop = tl.minimum(start + per_split, end)
    d = tl.arange(0, HEAD_DIM)
    q = tl.load(Q + b * sq_b + (h * GROUPS + g)[:, None] * sq_h + t[:, None] * sq_t + d[None, :],
                mask=row_ok[:, None], other=0.0)

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    if HAS_SLOTS:  # batch row b is cache slot Slots[b] (a prefill's pieces, in any slots)
        cb = tl.load(Slots + b).to(tl.int64)
    else:
        cb = b
    k_base = K + cb * sk_b + h * sk_h
    v_base = V + cb * sv_b + h * sv_h
    new_k_base = NewK + b * snk_b + h * snk_h
    new_v_base = NewV + b * snv_b + h * snv_h
    if STORE_NEW:
        # The new rows go into the cache here, by one program per (slot, KV head); every program reads
        # them from NewK/NewV, never from the cache, so no program waits on another's store.
        if (m_block == 0) & (split == 0):
            for t0 in range(0, T, BLOCK_N):
                tt = t0 + tl.arange(0, BLOCK_N)
                ok = (tt < T)[:, None]
                tl.store(k_base + (seq + tt)[:, None] * sk_n + d[None, :],
                         tl.load(new_k_base + tt[:, None] * snk_t + d[None, :], mask=ok), mask=ok)
                tl.store(v_base + (seq + tt)[:, None] * sv_n + d[None, :],
                         tl.load(new_v_base + tt[:, None] * snv_t + d[None, :], mask=ok), mask=ok)
    # The committed rows of this split first: every new token sees them all (from its window's first, if
    # any) and they come from the cache alone. Whole tiles take no mask at all without a window (their
    # loads go straight into the dots, which Triton pipelines), then the split's last, partial tile a
    # column mask; both are measured faster than one masked loop (benchmarks/h200-splitkv-tree). Scores
    # are kept in log2 units (exp2, the scale and log2(e) folded into one multiply); the merge knows.
    qk_scale = scale * 1.4426950408889634
    committed = tl.maximum(tl.minimum(stop, seq), start)  # a split past the committed rows has none
    whole = start + (committed - start) // BLOCK_N * BLOCK_N
    for n0 in range(start, whole, BLOCK_N):
        cols = n0 + tl.arange(0, BLOCK_N)
        k = tl.load(k_base + cols[:, None] * sk_n + d[None, :])
        s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * qk_scale
        if HAS_WINDOW:  # the walk starts at the block's smallest first: other rows' windows start later
            s = tl.where(cols[None, :] >= first[:, None], s, float("-inf"))
        p, alpha, m_i, l_i = _softmax_step(s, m_i, l_i)
        v = tl.load(v_base + cols[:, None] * sv_n + d[None, :])
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
    for n0 in range(whole, committed, BLOCK_N):  # at most one tile
        cols = n0 + tl.arange(0, BLOCK_N)
        col_ok = cols < committed
        k = tl.load(k_base + cols[:, None] * sk_n + d[None, :], mask=col_ok[:, None], other=0.0)
        s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * qk_scale
        visible = col_ok[None, :]
        if HAS_WINDOW:
            visible = visible & (cols[None, :] >= first[:, None])
        p, alpha, m_i, l_i = _softmax_step(tl.where(visible, s, float("-inf")), m_i, l_i)
        v = tl.load(v_base + cols[:, None] * sv_n + d[None, :], mask=col_ok[:, None], other=0.0)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
    # Then the new rows [seq, seq + T) in this split, visible where the round's mask says.
    for n0 in range(tl.maximum(start, seq), stop, BLOCK_N):
        cols = n0 + tl.arange(0, BLOCK_N)
        is_new = cols < stop
        rel = cols - seq  # the new row's index among the T
        if STORE_NEW:
            k = tl.load(new_k_base + rel[:, None] * snk_t + d[None, :], mask=is_new[:, None], other=0.0)
        else:
            k = tl.load(k_base + cols[:, None] * sk_n + d[None, :], mask=is_new[:, None], other=0.0)
        s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * qk_scale
        allowed = tl.load(NewMask + b * sm_b + t[:, None] * sm_q + rel[None, :] * sm_k,
                          mask=row_ok[:, None] & is_new[None, :], other=0)
        p, alpha, m_i, l_i = _softmax_step(tl.where(allowed != 0, s, float("-inf")), m_i, l_i)
        if STORE_NEW:
            v = tl.load(new_v_base + rel[:, None] * snv_t + d[None, :], mask=is_new[:, None], other=0.0)
        else:
            v = tl.load(v_base + cols[:, None] * sv_n + d[None, :], mask=is_new[:, None], other=0.0)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)

    if NUM_SPLITS == 1:
        if HAS_SINKS:
            l_i += _sink_term(Sinks, h * GROUPS + g, row_ok, m_i)
        out = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]
        tl.store(Out + b * so_b + t[:, None] * so_t + (h * GROUPS + g)[:, None] * HEAD_DIM + d[None, :],
                 out.to(Out.dtype.element_ty), mask=row_ok[:, None])
    else:
        part = (bh * NUM_SPLITS + split) * (tl.num_programs(1) * BLOCK_M) + rows
        tl.store(PartAcc + part[:, None] * HEAD_DIM + d[None, :], acc)
        tl.store(PartMax + part, m_i)
        tl.store(PartSum + part, l_i)


@triton.jit
def _merge(Out, PartAcc, PartMax, PartSum, Sinks, so_b, so_t, KV_HEADS, GROUPS, T, ROWS, PADDED,
           NUM_SPLITS: tl.constexpr, MERGE_M: tl.constexpr, HEAD_DIM: tl.constexpr, HAS_SINKS: tl.constexpr):
    # Every split of MERGE_M rows at once (a [splits, rows, head_dim] tile): one round of loads, not a
    # loop over the splits, whose dependent loads made this kernel cost twice the partial one.
    bh = tl.program_id(0)
    b = bh // KV_HEADS
    h = bh % KV_HEADS
    rows = tl.program_id(1) * MERGE_M + tl.arange(0, MERGE_M)
    d = tl.arange(0, HEAD_DIM)
    part = (bh * NUM_SPLITS + tl.arange(0, NUM_SPLITS))[:, None] * PADDED + rows[None, :]  # [splits, rows]
    m = tl.load(PartMax + part)
    m_all = tl.max(m, 0)
    # The partial kernel's maxima are in log2 units; an empty split: exp2(-inf) = 0.
    w = tl.exp2(m - tl.where(m_all == float("-inf"), 0.0, m_all)[None, :])
    total = tl.sum(w * tl.load(PartSum + part), 0)
    acc = tl.sum(w[:, :, None] * tl.load(PartAcc + part[:, :, None] * HEAD_DIM + d[None, None, :]), 0)
    g = rows // T
    t = rows % T
    if HAS_SINKS:  # here, not per split: each row counts its sink once
        total += _sink_term(Sinks, h * GROUPS + g, rows < ROWS, m_all)
    out = acc / tl.where(total == 0.0, 1.0, total)[:, None]
    tl.store(Out + b * so_b + t[:, None] * so_t + (h * GROUPS + g)[:, None] * HEAD_DIM + d[None, :],
             out.to(Out.dtype.element_ty), mask=(rows < ROWS)[:, None])


@functools.cache
def _multiprocessors(device: torch.device) -> int:
    if device.type != "cuda":
        return 4
    return torch.cuda.get_device_properties(device).multi_processor_count


def _programs_wanted(device: torch.device, per_sm: int = 2) -> int:
    return per_sm * _multiprocessors(device)


def num_splits(programs: int, capacity: int, device: torch.device, launch: Launch = DEFAULT_LAUNCH) -> int:
    """KV splits per (slot x KV head, row block): about `launch.programs_per_sm` programs per SM over the
    whole grid, at most one per block_n rows of the cache and MAX_SPLITS, a power of two (few distinct
    kernels)."""
    want = max(1, _programs_wanted(device, launch.programs_per_sm) // max(1, programs))
    want = min(want, max(1, capacity // launch.block_n), MAX_SPLITS)
    return 1 << (want.bit_length() - 1)


def splitkv_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, seq_lens: torch.Tensor,
                      new_mask: torch.Tensor, new_k: torch.Tensor | None = None,
                      new_v: torch.Tensor | None = None, launch: Launch | None = None,
                      slots: torch.Tensor | None = None, first: torch.Tensor | None = None,
                      sinks: torch.Tensor | None = None, window: int | None = None) -> torch.Tensor:
    """q: [B, H, T, D] new tokens' queries; k, v: [B, Hkv, L, D] the cache; seq_lens: [B] int32 committed
    rows; new_mask: [B, T, T] uint8 (1 = visible). new_k, new_v: [B, Hkv, T, D], the new tokens' keys
    and values, stored at rows seq_lens + t by the kernel itself (one launch instead of two scatters
    and the attention); None: those rows are in the cache already. slots: [B] long, the cache slot of
    each batch row (k, v then hold every slot, [S, Hkv, L, D]: a prefill's pieces in any slots, read and
    written in place); None: row b is slot b. first: [B, T] int32, a sliding window's first committed row
    each new token sees, in [0, seq_lens[b]] (the new rows stay new_mask's alone, the window folded in
    there); None: every committed row. sinks: [H] float32, attention-sink logits (scale * q.k units), one
    more term exp(sinks[h]) in each softmax denominator of head h; None: none. window: with `first`, the
    window's width (no token sees more committed rows), which sizes the splits in place of the capacity; a
    host constant of the layer, so the call's shape never follows a round. launch: None picks `launch_for`
    the shape. Returns [B, T, H*D]."""
    batch, heads, t, head_dim = q.shape
    kv_heads, capacity = k.shape[1], k.shape[2]
    groups = heads // kv_heads
    rows = groups * t
    launch = launch or launch_for(head_dim, rows, q.element_size(), batch)
    block_m = min(launch.max_block_m, max(16, triton.next_power_of_2(rows)))
    m_blocks = triton.cdiv(rows, block_m)
    reach = capacity if window is None or first is None else min(capacity, window)
    splits = num_splits(batch * kv_heads * m_blocks, reach, q.device, launch)
    out = torch.empty(batch, t, heads * head_dim, dtype=q.dtype, device=q.device)
    if splits > 1:
        parts = batch * kv_heads * splits * m_blocks * block_m
        part_acc = torch.empty(parts, head_dim, dtype=torch.float32, device=q.device)
        part_max = torch.empty(parts, dtype=torch.float32, device=q.device)
        part_sum = torch.empty(parts, dtype=torch.float32, device=q.device)
    else:
        part_acc = part_max = part_sum = out  # unused
    store_new = new_k is not None
    if not store_new:
        new_k = new_v = k  # unused
    if any(x.stride(3) != 1 for x in (q, k, v, new_k, new_v)):
        raise ValueError("splitkv attention needs the head dimension contiguous")
    has_window, has_sinks = first is not None, sinks is not None
    first_strides = first.stride() if has_window else (0, 0)
    if not has_window:
        first = seq_lens  # unused
    if not has_sinks:
        sinks = part_max  # unused
    _partial[(batch * kv_heads, m_blocks, splits)](
        q, k, v, new_k, new_v, seq_lens, new_mask, seq_lens if slots is None else slots, first, sinks, out,
        part_acc, part_max, part_sum,
        q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
        v.stride(0), v.stride(1), v.stride(2), new_k.stride(0), new_k.stride(1), new_k.stride(2),
        new_v.stride(0), new_v.stride(1), new_v.stride(2), new_mask.stride(0), new_mask.stride(1),
        new_mask.stride(2), *first_strides, out.stride(0), out.stride(1), head_dim ** -0.5,
        kv_heads, groups, t, rows,
        NUM_SPLITS=splits, BLOCK_M=block_m, BLOCK_N=launch.block_n, HEAD_DIM=head_dim,
        # float32 stays float32 (TF32 would round the operands to 10 bits: the float32 equality checks
        # compare rounds of different shapes); 16-bit operands are exact in either.
        PRECISION="ieee" if q.dtype == torch.float32 else "tf32", STORE_NEW=store_new, HAS_SLOTS=slots is not None,
        HAS_WINDOW=has_window, HAS_SINKS=has_sinks,
        num_warps=launch.num_warps, **({} if launch.num_stages is None else {"num_stages": launch.num_stages}))
    if splits > 1:
        merge_m = max(1, min(16, MERGE_TILE // (splits * head_dim)))
        merge_m = 1 << (merge_m.bit_length() - 1)
        _merge[(batch * kv_heads, triton.cdiv(rows, merge_m))](
            out, part_acc, part_max, part_sum, sinks, out.stride(0), out.stride(1), kv_heads, groups, t, rows,
            m_blocks * block_m, NUM_SPLITS=splits, MERGE_M=merge_m, HEAD_DIM=head_dim, HAS_SINKS=has_sinks)
    return out
