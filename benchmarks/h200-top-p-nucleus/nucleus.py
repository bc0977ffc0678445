"""top-p's nucleus without sorting, one Triton kernel (CUDA): the second version, checked under Triton's
interpreter (tests/test_top_p_nucleus.py) and not yet timed on a GPU; `nucleus_v1.py` is the first, measured.

`sampling._top_p` keeps the smallest set of most probable tokens whose mass reaches top_p (ties ranked by
the larger token id first) by a stable sort of every row. A tree samples at every node, so at Qwen3's
vocabulary that sort was 1.3-1.6 ms for one slot's 65 nodes and 8.7-10.2 ms for eight slots, more than the
rest of such a round (README.md here). The nucleus needs only its boundary, not the order:

- v, the smallest kept probability, is the largest value x with mass(p >= x) >= top_p * total. A
  non-negative float32 orders as its bit pattern, so v is searched over the patterns, `ways` ways a pass:
  each pass reads the row once and sums, in float64, the mass at or above ways - 1 thresholds besides the
  range's start (4 ways: 16 passes narrow the 2^31 patterns to one; the first pass also sums the total).
- Every token above v is kept and every token below it dropped. Among the tokens equal to v, the one
  with t ties of larger id ranked before it is kept when mass(p > v) + t * v < top_p * total: a last
  pass writes the kept probabilities (walking the row from its end, counting ties, when v is not unique).

That is the sort's rule (a token is kept when the mass ranked above it is below top_p * total), the sums in
float64 as there, added in another order: a decision can differ from the sort's only where the mass above a
token is within float64 rounding (~1e-16) of top_p * total. One program per row. Unlike the first version,
a pass adds into a [block, ways] accumulator and reduces it once at its end, not at every step.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

_BLOCK = 512  # tokens per step of a pass
_WAYS = 4  # sub-ranges per pass of the search (16 passes)


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
    # Search the bit patterns [lo, hi): mass(bits >= lo) >= target > mass(bits >= hi) throughout. Each pass
    # adds into a [BLOCK, WAYS] accumulator and reduces it once at its end (a reduction per step was most
    # of the time).
    lo = tl.zeros([], tl.int64)
    hi = tl.full([], 0x7F800001, tl.int64)  # +inf's pattern + 1: nothing at or above it
    target = tl.zeros([], tl.float64)
    for step in range(PASSES):
        width = hi - lo
        # Thresholds lo + ceil(width * k / WAYS) for k = 0..WAYS-1: k = 0 is lo itself (its mass: the total,
        # in the first pass); equal thresholds when the range is narrow are harmless.
        thresholds = lo + (width * ways + WAYS - 1) // WAYS
        acc = tl.zeros([BLOCK, WAYS], tl.float64)
        for start in range(0, vocab, BLOCK):
            x = tl.load(base + start + cols, mask=start + cols < vocab, other=0.0)
            bits = x.to(tl.int32, bitcast=True).to(tl.int64)
            acc += tl.where(bits[:, None] >= thresholds[None, :], x.to(tl.float64)[:, None], 0.0)
        mass = tl.sum(acc, 0)
        if step == 0:
            target = top_p * tl.sum(tl.where(ways == 0, mass, 0.0), 0)
        reaching = mass >= target  # true for k = 0, then false from some k on
        best = tl.max(tl.where(reaching, ways, 0), 0)  # the last threshold that still reaches
        new_lo = tl.sum(tl.where(ways == best, thresholds, 0), 0)
        nxt = tl.sum(tl.where(ways == best + 1, thresholds, 0), 0)
        hi = tl.where(best == WAYS - 1, hi, nxt)
        lo = new_lo
    # lo is v's pattern: the mass strictly above v and the number of tokens equal to it.
    v = lo.to(tl.int32).to(tl.float32, bitcast=True).to(tl.float64)
    over_acc = tl.zeros([BLOCK], tl.float64)
    ties_acc = tl.zeros([BLOCK], tl.int64)
    for start in range(0, vocab, BLOCK):
        x = tl.load(base + start + cols, mask=start + cols < vocab, other=0.0)
        bits = x.to(tl.int32, bitcast=True).to(tl.int64)
        over_acc += tl.where(bits > lo, x.to(tl.float64), 0.0)
        ties_acc += (bits == lo).to(tl.int64)
    over = tl.sum(over_acc, 0)
    ties = tl.sum(ties_acc, 0)
    if ties == 1:  # the usual case: v is one token's, kept (over < target always holds for it)
        for start in range(0, vocab, BLOCK):
            ok = start + cols < vocab
            x = tl.load(base + start + cols, mask=ok, other=0.0)
            bits = x.to(tl.int32, bitcast=True).to(tl.int64)
            tl.store(out + start + cols, tl.where(bits >= lo, x, 0.0), mask=ok)
    else:  # ties at v: from the row's end (larger ids first), counting them
        ties_after = tl.zeros([], tl.int64)  # ties at ids past the current block
        last = (vocab - 1) // BLOCK * BLOCK
        for back in range(0, vocab, BLOCK):
            start = last - back
            ok = start + cols < vocab
            x = tl.load(base + start + cols, mask=ok, other=0.0)
            bits = x.to(tl.int32, bitcast=True).to(tl.int64)
            tie = ok & (bits == lo)
            tie_i = tie.to(tl.int64)
            # ties ranked before each one: those at larger ids, in this block and after it
            before = ties_after + tl.sum(tie_i, 0) - tl.cumsum(tie_i, 0)
            keep = (ok & (bits > lo)) | (tie & (over + before.to(tl.float64) * v < target))
            tl.store(out + start + cols, tl.where(keep, x, 0.0), mask=ok)
            ties_after += tl.sum(tie_i, 0)


def _passes(ways: int) -> int:
    """Passes of a `ways`-way search to narrow the 2^31 + 1 patterns of [0, +inf] to one."""
    passes, reach = 0, 1
    while reach < 0x7F800001:
        passes, reach = passes + 1, reach * ways
    return passes


def top_p_nucleus(probs: torch.Tensor, top_p: torch.Tensor, ways: int = _WAYS, block: int = _BLOCK,
                  num_warps: int = 4) -> torch.Tensor:
    """probs [R, V] float32 (>= 0), top_p [R] float64 -> probs with every token outside its row's nucleus
    zeroed (not renormalised); rows with top_p >= 1 unchanged. ways, block, num_warps: the search's launch
    (powers of two)."""
    rows, vocab = probs.shape
    if probs.stride(-1) != 1:
        probs = probs.contiguous()
    top_p = top_p.to(torch.float64).contiguous()
    out = torch.empty_like(probs)
    _nucleus[(rows,)](probs, top_p, out, vocab, probs.stride(0), out.stride(0), BLOCK=block, WAYS=ways,
                      PASSES=_passes(ways), num_warps=num_warps)
    return out
