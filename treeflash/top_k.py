"""The k best tokens of each (slot, depth) row of draft log-probs, as Triton kernels (CUDA): DDTree's
per-depth candidates, the input of `tree_kernel.build_tree_kernel`.

Tokens are ranked by one int64 key each (`_pack`: the score's 32 order bits above the token reversed), so
equal scores rank the lower token first and every method here returns the same answer, bit for bit. Two
methods, chosen by the vocabulary (`top_k_kernel`):

- pieces (`top_k_pieces`): each row cut into pieces ranked by their own programs, streaming 2,048 tokens
  at a time through Triton's bitonic `tl.topk`, then one program per row merges the pieces' best. Nearly
  all of that sorting ranks tokens that cannot be in the top k: at a 151,936-token vocabulary it cost
  ~107 us at one slot (k = 64) on the H200.
- filter (`top_k_filter`): a bound on each row's k-th best, then a sort of the few tokens that reach it.
  1. `_block_maxima` (program per (row, piece)): the row is cut into blocks of BS tokens; each program
     takes its blocks' maxima (one read, no sort). The row's last program to finish (an atomic counter)
     finds b = the k-th largest block maximum by a radix search over their order bits (8 rounds of 16
     counts). b <= the row's k-th best value: k distinct blocks each hold an element >= b.
  2. `_filter_select` (program per (row, piece)): reloads only the blocks whose maximum is >= b and appends
     the elements > b, and those == b, as keys to the row's candidate buffer (an atomic counter hands out
     places). Elements > b lie in the < k blocks whose maximum is > b; equal ones can be many (ties, rows
     of -inf), but the top k takes the lowest tokens among them, so a piece keeps its first k. The row's
     last program to finish ranks the candidates with `tl.topk` and writes the row's answer; should they
     not fit the buffer (`capacity`: only a row whose top crowds into a few blocks can), it ranks the
     whole row instead (slow, exact).
  Measured on the H200 (bfloat16, 15 depths, benchmarks/h200-topk-filter): vocabulary 151,936, k = 16 / 64:
  34 / 46 us at one slot against the pieces' 62 / 107, 525 / 570 at 32 slots against 1,436 / 2,535;
  vocabulary 49,152: 18 / 23 at one slot against 27 / 50; equal outputs at every point. Smaller
  vocabularies (the shipped drafter's 16,384-token draft vocabulary) keep the pieces: not measured there.

Fixed grids, a memset of the counters and no host synchronisation: both can be captured in a CUDA graph.
Under TRITON_INTERPRET=1 the same kernels run on CPU tensors (tests; float32).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

# The filter for vocabularies of at least this many tokens (measured faster at 49,152 and 151,936); the
# pieces below it.
FILTER_FROM_VOCAB = 32768


@triton.jit
def _sortable(x):
    # float32 -> int64 in [0, 2^32) with the floats' order (-0.0 counted as +0.0, as comparisons do).
    b = (x + 0.0).to(tl.int32, bitcast=True).to(tl.int64)
    return tl.where(b >= 0, b + 2147483648, 2147483647 - (b & 2147483647))


@triton.jit
def _float_of(key):
    # The inverse of _sortable.
    b = tl.where(key >= 2147483648, key - 2147483648, -1 - key)
    return b.to(tl.int32).to(tl.float32, bitcast=True)


@triton.jit
def _pack(x, low):
    # One int64 key ordered by the float x, then by low (in [0, 2^31)): x's 32 order bits sit above 31
    # bits of low, so every key is >= 0 and -1 pads below all of them. (A 32-bit shift put x >= +0.0,
    # a log-prob of exactly 0, into the sign bit and ranked it last.)
    return (_sortable(x) << 31) | low


@triton.jit
def _unpack(key):
    # (x, low) of a key from _pack.
    return _float_of(key >> 31), key & 2147483647


@triton.jit
def _best_keys(row, first, length, stop, BK: tl.constexpr, CHUNK: tl.constexpr):
    # The best BK keys of tokens [first, min(first + length, stop)) of a row, streamed CHUNK tokens at a
    # time into a running top BK (length: whole chunks).
    best = tl.full([BK], -1, tl.int64)
    t = tl.arange(0, CHUNK)
    for start in range(0, length, CHUNK):
        token = first + start + t
        x = tl.load(row + token, mask=token < stop, other=0.0).to(tl.float32)
        top = tl.topk(tl.where(token < stop, _pack(x, 2147483647 - token), -1), BK)
        best = tl.topk(tl.reshape(tl.join(best, top), [2 * BK]), BK)
    return best


@triton.jit
def _piece_top_k(X, Keys, V, SPAN, DEPTHS, PIECES, sx_s, sx_d, BK: tl.constexpr, CHUNK: tl.constexpr):
    # Program (row, piece): the best BK of the row's tokens [piece * SPAN, (piece + 1) * SPAN).
    r = tl.program_id(0) // PIECES
    piece = tl.program_id(0) % PIECES
    row = X + (r // DEPTHS) * sx_s + (r % DEPTHS) * sx_d
    best = _best_keys(row, piece * SPAN, SPAN, tl.minimum(V, (piece + 1) * SPAN), BK, CHUNK)
    tl.store(Keys + tl.program_id(0) * BK + tl.arange(0, BK), best)


@triton.jit
def _merge_top_k(Keys, OutScores, OutTokens, K, BK: tl.constexpr, PB: tl.constexpr):
    # Program per row: the best BK of its pieces' PB = pieces * BK keys, unpacked.
    r = tl.program_id(0)
    best = tl.topk(tl.load(Keys + r * PB + tl.arange(0, PB)), BK)
    score, low = _unpack(best)
    j = tl.arange(0, BK)
    tl.store(OutScores + r * K + j, score, mask=j < K)
    tl.store(OutTokens + r * K + j, 2147483647 - low, mask=j < K)


def top_k_pieces(logprobs: torch.Tensor, k: int, pieces: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """`top_k_kernel` by the pieces method (module docstring): each row split into `pieces` (a power of two;
    default about 2,048 tokens each, at most 16) ranked by their own programs, so a batch-1 round's 15 rows
    fill more than 15 of the GPU's SMs, then one program per row merges its pieces' best. Two launches."""
    slots, depths, vocab = logprobs.shape
    if logprobs.stride(-1) != 1:
        logprobs = logprobs.contiguous()
    bk = max(2, triton.next_power_of_2(k))  # Triton's top-k of one element reduces to a scalar
    if pieces is None:
        pieces = min(16, triton.next_power_of_2(triton.cdiv(vocab, 2048)))
    chunk = max(bk, min(2048, triton.next_power_of_2(triton.cdiv(vocab, pieces))))
    span = triton.cdiv(triton.cdiv(vocab, pieces), chunk) * chunk  # whole chunks: the loop's bound
    rows, dev = slots * depths, logprobs.device
    keys = torch.empty(rows, pieces, bk, dtype=torch.long, device=dev)
    scores = torch.empty(slots, depths, k, dtype=torch.float32, device=dev)
    tokens = torch.empty(slots, depths, k, dtype=torch.long, device=dev)
    _piece_top_k[(rows * pieces,)](logprobs, keys, vocab, span, depths, pieces, logprobs.stride(0),
                                   logprobs.stride(1), BK=bk, CHUNK=chunk, num_warps=4)
    _merge_top_k[(rows,)](keys, scores, tokens, k, BK=bk, PB=pieces * bk, num_warps=4)
    return scores, tokens


@triton.jit
def _order32(x):
    # _sortable(x) - 2^31 as an int32 (the floats' order, -0.0 as +0.0): half the registers of
    # the int64 for the whole row's maxima.
    b = (x + 0.0).to(tl.int32, bitcast=True)
    return tl.where(b >= 0, b, b ^ 2147483647)


@triton.jit
def _rank(m):
    # For each element of the [blocks, BS] mask m (blocks in token order), how many set elements come
    # before it in token order: places in the candidate buffer, and ranks among equal scores.
    c = m.to(tl.int32)
    per_block = tl.sum(c, axis=1)
    return (tl.cumsum(per_block, axis=0) - per_block)[:, None] + tl.cumsum(c, axis=1) - c


@triton.jit
def _block_maxima(X, Maxima, Bound, Arrived, V, K, DEPTHS, PIECES, sx_s, sx_d,
                  BS: tl.constexpr, NBP: tl.constexpr, MP: tl.constexpr):
    # Program (row, piece): the maxima of the piece's NBP blocks of BS tokens, as _sortable values
    # (-1: a block past the row's end). The row's last program to finish also writes Bound[row].
    r = tl.program_id(0) // PIECES
    piece = tl.program_id(0) % PIECES
    row = X + (r // DEPTHS).to(tl.int64) * sx_s + (r % DEPTHS).to(tl.int64) * sx_d
    blocks = PIECES * NBP  # of the row
    blk = tl.arange(0, NBP)
    first = piece * (NBP * BS) + blk * BS
    token = first[:, None] + tl.arange(0, BS)[None, :]
    x = tl.load(row + token, mask=token < V, other=0.0).to(tl.float32)
    top = tl.max(tl.where(token < V, _order32(x), -2147483648), axis=1)
    tl.store(Maxima + r * blocks + piece * NBP + blk, tl.where(first < V, top.to(tl.int64) + 2147483648, -1))
    # The barrier orders every thread's stores before the counter's (release) increment, which one thread
    # makes; the last program's loads come after its (acquire) increment. .cg: from L2, not a stale L1.
    tl.debug_barrier()
    if tl.atomic_add(Arrived + r, 1) == PIECES - 1:
        m = tl.arange(0, MP)
        u = tl.load(Maxima + r * blocks + m, mask=m < blocks, other=-1, cache_modifier=".cg")
        # b = the largest t with at least K maxima >= t, 4 bits at a time from the top: each round
        # counts the maxima >= each of the 16 next digits and keeps the largest digit that leaves K.
        d = tl.arange(0, 16).to(tl.int64)
        t = tl.full([], 0, tl.int64)
        for i in tl.static_range(8):
            cand = t + (d << (28 - 4 * i))
            n = tl.sum((u[None, :] >= cand[:, None]).to(tl.int32), axis=1)
            t = t + (tl.max(tl.where(n >= K, d, 0), axis=0) << (28 - 4 * i))
        # Fewer than K real blocks (a short row): no bound, every token is a candidate.
        enough = tl.sum((u >= 0).to(tl.int32), axis=0) >= K
        tl.store(Bound + r, tl.where(enough, t, -1))


@triton.jit
def _filter_select(X, Maxima, Bound, Counted, Arrived, Cand, OutScores, OutTokens,
                   V, K, DEPTHS, PIECES, C, sx_s, sx_d,
                   BK: tl.constexpr, BS: tl.constexpr, NBP: tl.constexpr, CHUNK: tl.constexpr):
    # Program (row, piece): the piece's candidates into the row's buffer; the row's last program to
    # finish ranks them into the row's answer.
    r = tl.program_id(0) // PIECES
    piece = tl.program_id(0) % PIECES
    row = X + (r // DEPTHS).to(tl.int64) * sx_s + (r % DEPTHS).to(tl.int64) * sx_d
    b = tl.load(Bound + r)
    blk = tl.arange(0, NBP)
    token = (piece * (NBP * BS) + blk * BS)[:, None] + tl.arange(0, BS)[None, :]
    top = tl.load(Maxima + r * (PIECES * NBP) + piece * NBP + blk)
    live = (top >= b)[:, None] & (token < V)  # the other blocks hold nothing >= b: not even loaded
    x = tl.load(row + token, mask=live, other=0.0).to(tl.float32)
    s = _sortable(x)  # >= 0, so b = -1 (no bound) takes every live token
    above = live & (s > b)
    equal = live & (s == b)
    keep = above | equal
    if tl.sum(equal.to(tl.int32)) > K:  # ties at b: only the piece's K lowest tokens can count
        keep = above | (equal & (_rank(equal) < K))
    place = tl.atomic_add(Counted + r, tl.sum(keep.to(tl.int32))) + _rank(keep)
    tl.store(Cand + r.to(tl.int64) * C + place, _pack(x, 2147483647 - token), mask=keep & (place < C))
    tl.debug_barrier()  # as in _block_maxima: the stores, then the release
    if tl.atomic_add(Arrived + r, 1) == PIECES - 1:
        total = tl.atomic_add(Counted + r, 0)  # read at L2, after every program's own increment
        j = tl.arange(0, BK)
        if total <= C:
            best = tl.full([BK], -1, tl.int64)
            for start in range(0, total, BK):
                key = tl.load(Cand + r.to(tl.int64) * C + start + j, mask=start + j < total, other=-1,
                              cache_modifier=".cg")
                best = tl.topk(tl.reshape(tl.join(best, key), [2 * BK]), BK)
        else:
            best = _best_keys(row, 0, tl.cdiv(V, CHUNK) * CHUNK, V, BK, CHUNK)  # the fallback: the whole row
        score, low = _unpack(best)
        tl.store(OutScores + r * K + j, score, mask=j < K)
        tl.store(OutTokens + r * K + j, 2147483647 - low, mask=j < K)


@dataclass(frozen=True)
class FilterPlan:
    """How `top_k_filter` cuts a row (`filter_plan`)."""

    bk: int  # next power of two >= k (>= 2)
    bs: int  # tokens a block
    nbp: int  # blocks a piece (a program)
    pieces: int  # programs a row, each kernel
    mp: int  # the row's blocks, padded to a power of two
    capacity: int  # candidate places a row
    chunk: int  # the fallback's chunk


def filter_plan(vocab: int, k: int, ratio: int = 8, max_blocks: int = 1024, piece: int | None = None,
                capacity: int | None = None) -> FilterPlan:
    """The shapes for a [.., vocab] row's top k. ratio: blocks a row per BK (more: a tighter bound, so fewer
    candidates and fewer blocks reloaded, but a longer bound search); max_blocks caps the blocks a row (the
    search's width). piece: tokens a program (default ~vocab / 16, 1,024-8,192). capacity: candidate places a
    row (default: all that ties and smooth rows can need; past it the row falls back to a full ranking)."""
    bk = max(2, triton.next_power_of_2(k))  # Triton's top-k of one element reduces to a scalar
    bs = triton.next_power_of_2(max(triton.cdiv(vocab, ratio * bk), triton.cdiv(vocab, max_blocks), 2))
    if piece is None:
        piece = min(8192, max(1024, triton.next_power_of_2(triton.cdiv(vocab, 16))))
    piece = max(bs, triton.next_power_of_2(min(piece, vocab)))
    pieces = triton.cdiv(vocab, piece)
    nbp = piece // bs
    # Candidates never exceed (k - 1) * bs above b plus k equal to b a piece (nor the vocabulary).
    worst = min(vocab, (k - 1) * bs + pieces * min(k, piece))
    if capacity is None:
        capacity = max(4096, pieces * k + 4 * bk)
    return FilterPlan(bk=bk, bs=bs, nbp=nbp, pieces=pieces, mp=triton.next_power_of_2(pieces * nbp),
                      capacity=max(1, min(worst, capacity)), chunk=max(bk, 1024))


def top_k_filter(logprobs: torch.Tensor, k: int, *, ratio: int = 8, max_blocks: int = 1024,
                 piece: int | None = None, capacity: int | None = None,
                 warps: tuple[int, int] = (4, 4)) -> tuple[torch.Tensor, torch.Tensor]:
    """`top_k_kernel` by the filter method (module docstring). The keywords tune the shapes (`filter_plan`)
    and the warps of the two kernels (two launches and a memset of the counters)."""
    slots, depths, vocab = logprobs.shape
    if logprobs.stride(-1) != 1:
        logprobs = logprobs.contiguous()
    p = filter_plan(vocab, k, ratio, max_blocks, piece, capacity)
    rows, dev = slots * depths, logprobs.device
    counters = torch.zeros(3, rows, dtype=torch.int32, device=dev)  # arrivals (1, 2), candidates (2)
    maxima = torch.empty(rows, p.pieces * p.nbp, dtype=torch.long, device=dev)
    bound = torch.empty(rows, dtype=torch.long, device=dev)
    cand = torch.empty(rows, p.capacity, dtype=torch.long, device=dev)
    scores = torch.empty(slots, depths, k, dtype=torch.float32, device=dev)
    tokens = torch.empty(slots, depths, k, dtype=torch.long, device=dev)
    grid = (rows * p.pieces,)
    _block_maxima[grid](logprobs, maxima, bound, counters[0], vocab, k, depths, p.pieces,
                        logprobs.stride(0), logprobs.stride(1), BS=p.bs, NBP=p.nbp, MP=p.mp, num_warps=warps[0])
    _filter_select[grid](logprobs, maxima, bound, counters[1], counters[2], cand, scores, tokens,
                         vocab, k, depths, p.pieces, p.capacity, logprobs.stride(0), logprobs.stride(1),
                         BK=p.bk, BS=p.bs, NBP=p.nbp, CHUNK=p.chunk, num_warps=warps[1])
    return scores, tokens


def top_k_kernel(logprobs: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The k best tokens of every (slot, depth) row of logprobs [S, D, V] (any float dtype), as
    `logprobs.float().topk(k, dim=-1)` gives them but without the float32 copy: scores [S, D, k]
    float32 descending, tokens [S, D, k] long; equal scores rank the lower token first (torch.topk
    leaves their order unspecified). k <= V. The filter method from FILTER_FROM_VOCAB tokens, the pieces
    below (the same answer either way)."""
    if logprobs.shape[-1] >= FILTER_FROM_VOCAB:
        return top_k_filter(logprobs, k)
    return top_k_pieces(logprobs, k)
