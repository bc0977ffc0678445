"""The first top-p nucleus kernel, as the H200 call ran it (then `treeflash/top_p.py`, with `sampling._top_p`
dispatching to it on CUDA): a 16-way search over float32 bit patterns, 8 passes, a float64 reduction at every
step of every pass, one program per row. Measured in `top_p_ab.txt`: the same tokens as the sort everywhere,
and slower than it but at 1,024 rows. `nucleus.py` is the second version (not timed)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

_BLOCK = 256  # tokens per step of a pass
_WAYS = 16  # sub-ranges per pass of the search (15 thresholds)
_PASSES = 8  # 16^8 = 2^32 >= the 2^31 + 1 bit patterns of non-negative float32 values up to infinity


@triton.jit
def _nucleus(P, TopP, Out, vocab, stride, out_stride, BLOCK: tl.constexpr, WAYS: tl.constexpr,
             PASSES: tl.constexpr):
    row = tl.program_id(0)
    base = P + row * stride
    top_p = tl.load(TopP + row)
    cols = tl.arange(0, BLOCK)
    ways = tl.arange(0, WAYS)
    if top_p >= 1.0:  # keeps everything (as the sort's rule does)
        for start in range(0, vocab, BLOCK):
            ok = start + cols < vocab
            tl.store(Out + row * out_stride + start + cols, tl.load(base + start + cols, mask=ok), mask=ok)
    else:
        _cut(base, Out + row * out_stride, vocab, top_p, cols, ways, BLOCK, WAYS, PASSES)


@triton.jit
def _cut(base, out, vocab, top_p, cols, ways, BLOCK: tl.constexpr, WAYS: tl.constexpr, PASSES: tl.constexpr):
    # Search the bit patterns [lo, hi): mass(bits >= lo) >= target > mass(bits >= hi) throughout.
    lo = tl.zeros([], tl.int64)
    hi = tl.full([], 0x7F800001, tl.int64)  # +inf's pattern + 1: nothing at or above it
    target = tl.zeros([], tl.float64)
    for step in range(PASSES):
        width = hi - lo
        thresholds = lo + (width * ways + WAYS - 1) // WAYS
        mass = tl.zeros([WAYS], tl.float64)
        for start in range(0, vocab, BLOCK):
            ok = start + cols < vocab
            x = tl.load(base + start + cols, mask=ok, other=0.0)
            bits = x.to(tl.int32, bitcast=True).to(tl.int64)
            above = (bits[:, None] >= thresholds[None, :]) & ok[:, None]
            mass += tl.sum(tl.where(above, x.to(tl.float64)[:, None], 0.0), 0)
        if step == 0:
            target = top_p * tl.sum(tl.where(ways == 0, mass, 0.0), 0)
        reaching = mass >= target
        best = tl.max(tl.where(reaching, ways, 0), 0)
        new_lo = tl.sum(tl.where(ways == best, thresholds, 0), 0)
        nxt = tl.sum(tl.where(ways == best + 1, thresholds, 0), 0)
        hi = tl.where(best == WAYS - 1, hi, nxt)
        lo = new_lo
    v = lo.to(tl.int32).to(tl.float32, bitcast=True).to(tl.float64)
    over = tl.zeros([], tl.float64)
    for start in range(0, vocab, BLOCK):
        ok = start + cols < vocab
        x = tl.load(base + start + cols, mask=ok, other=0.0)
        bits = x.to(tl.int32, bitcast=True).to(tl.int64)
        over += tl.sum(tl.where(ok & (bits > lo), x.to(tl.float64), 0.0), 0)
    ties_after = tl.zeros([], tl.int64)
    last = (vocab - 1) // BLOCK * BLOCK
    for back in range(0, vocab, BLOCK):
        start = last - back
        ok = start + cols < vocab
        x = tl.load(base + start + cols, mask=ok, other=0.0)
        bits = x.to(tl.int32, bitcast=True).to(tl.int64)
        tie = ok & (bits == lo)
        tie_i = tie.to(tl.int64)
        before = ties_after + tl.sum(tie_i, 0) - tl.cumsum(tie_i, 0)
        keep = (ok & (bits > lo)) | (tie & (over + before.to(tl.float64) * v < target))
        tl.store(out + start + cols, tl.where(keep, x, 0.0), mask=ok)
        ties_after += tl.sum(tie_i, 0)


def top_p_nucleus(probs: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    rows, vocab = probs.shape
    if probs.stride(-1) != 1:
        probs = probs.contiguous()
    top_p = top_p.to(torch.float64).contiguous()
    out = torch.empty_like(probs)
    _nucleus[(rows,)](probs, top_p, out, vocab, probs.stride(0), out.stride(0), BLOCK=_BLOCK, WAYS=_WAYS,
                      PASSES=_PASSES)
    return out
