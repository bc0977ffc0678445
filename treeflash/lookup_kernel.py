"""Prompt lookup and its graft (treeflash/lookup.py) as one Triton kernel (CUDA): the same tree from one
launch a round instead of dozens.

`lookup` and `graft` are written as whole-width tensor ops so that they capture in a CUDA graph, but
each op is a launch, and over a slot's whole history capacity (not its length) the lookup's
[slots, width, 3] comparisons are real bytes at batch 32. On an H100 at the SmolLM2 shape (random
weights, context 512, benchmarks/h100-lookup-synthetic/) the pair added 0.12 ms to a batch-1 DDTree-64
round's tree stage and 0.51 ms at batch 32: more than the tokens it adds are worth at batch 1.
Measured after (benchmarks/gpu-lookup-kernel/, H100, graph replays, 8 tokens, a DDTree-64 tree): 0.005-0.010
ms for 1-32 slots and histories of 1,024-8,192 tokens, against 0.11-1.89 ms for the ops; the batch-1
DDTree-64 round with lookup 1.2% over the round without it instead of 8.8%.

Here one program per slot does both: it scans the slot's committed tokens up to its length (a loop
bounded by the length read on the device: no host value, so still capturable) for the latest
occurrence of the longest suffix, walks the tree down the copied chain (siblings are distinct, so each
depth has at most one valid child with the chain's token: one masked max over the nodes per depth),
and writes the merged tree, old nodes copied and new ones appended.

The result is `graft(tree, *lookup(history, seq_lens, bonus, tokens))`, field for field, including the
tokens and parents of nodes it marks invalid (tests: through Triton's interpreter on the CPU;
`scripts/gpu_check.py` section T on a GPU). `lookup.graft_lookup` picks it on CUDA; the torch ops stay
the reference and the CPU path.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from treeflash.lookup import NGRAM_MAX, NGRAM_MIN
from treeflash.tree import DraftTree

SCAN_BLOCK = 1024  # history tokens compared per step of a program's scan


@triton.jit
def _lookup_graft(History, hist_stride, SeqLens, Bonus,
                  Tokens, Parents, Depths, Valid, Scores,
                  OutTokens, OutParents, OutDepths, OutValid, OutScores,
                  C, N, L,
                  BLOCK: tl.constexpr, NP: tl.constexpr, LP: tl.constexpr):
    s = tl.program_id(0)
    hist = History + s.to(tl.int64) * hist_stride
    seq_len = tl.load(SeqLens + s).to(tl.int64)
    bonus = tl.load(Bonus + s).to(tl.int64)
    width = C + 1  # lookup's padded sequence: the history and one more row for the root

    # The suffix is (seq[n-3], seq[n-2], seq[n-1]) with n = seq_len + 1: the last two committed tokens and
    # the root. Where it is shorter, no candidate end reaches the missing token (-1 never matches).
    s1 = tl.load(hist + seq_len - 1, mask=seq_len >= 1, other=-1).to(tl.int64)
    s2 = tl.load(hist + seq_len - 2, mask=seq_len >= 2, other=-1).to(tl.int64)

    # Candidate ends e in [0, seq_len - 1] (the continuation e + 1 must lie inside the sequence); the key
    # matched * width + e takes the longest match, then the latest, as `lookup`'s amax does.
    best = tl.full([], -1, tl.int64)
    for start in range(0, seq_len, BLOCK):
        e = start + tl.arange(0, BLOCK).to(tl.int64)
        inside = e < seq_len
        t0 = tl.load(hist + e, mask=inside, other=-1).to(tl.int64)
        t1 = tl.load(hist + e - 1, mask=inside & (e >= 1), other=-2).to(tl.int64)
        t2 = tl.load(hist + e - 2, mask=inside & (e >= 2), other=-2).to(tl.int64)
        m0 = t0 == bonus
        m1 = m0 & (t1 == s1)
        m2 = m1 & (t2 == s2)
        matched = m0.to(tl.int64) + m1.to(tl.int64) + m2.to(tl.int64)
        key = tl.where(inside & (matched > 0), matched * width + e, -1)
        best = tl.maximum(best, tl.max(key, 0))
    found = best >= 0

    # The chain, as `lookup` returns it: where nothing matched its amax lands on the last column, so the
    # positions start past the end (clamped there) and none is ok.
    t = tl.arange(0, LP)
    at = tl.where(found, best % width + 1, width) + t
    a = tl.minimum(at, width - 1)
    in_chain = t < L
    stored = tl.load(hist + tl.where(a == C, 0, a), mask=in_chain, other=0).to(tl.int64)
    ok = found & (at < seq_len + 1) & in_chain
    chain = tl.where(ok, tl.where(a == seq_len, bonus, stored), 0)  # (0 where not ok, as `lookup`)
    spelled = tl.where(ok, chain, -1)

    # Down the tree along the chain: the deepest node whose path spells the chain's first `depth` tokens.
    j = tl.arange(0, NP)
    in_tree = j < N
    row = s.to(tl.int64) * N
    tok = tl.load(Tokens + row + j, mask=in_tree, other=-1)
    par = tl.load(Parents + row + j, mask=in_tree, other=-1)
    val = tl.load(Valid + row + j, mask=in_tree, other=0) != 0
    cur = tl.full([], 0, tl.int64)
    depth = tl.full([], 0, tl.int64)
    going = tl.full([], 1, tl.int1)
    for d in range(L):
        c = tl.sum(tl.where(t == d, spelled, 0), 0)
        hit = val & (par == cur) & (tok == c) & (j > 0)
        idx = tl.max(tl.where(hit, j, -1), 0).to(tl.int64)
        step = going & (idx >= 0)
        cur = tl.where(step, idx, cur)
        depth = tl.where(step, d + 1, depth)
        going = step

    # The merged tree: the old nodes, then the chain's L (its first `depth` invalid, hanging off the root;
    # the rest each below the one before, the first below the deepest node found).
    out = s.to(tl.int64) * (N + L)
    tl.store(OutTokens + out + j, tok, mask=in_tree)
    tl.store(OutParents + out + j, par, mask=in_tree)
    tl.store(OutDepths + out + j, tl.load(Depths + row + j, mask=in_tree), mask=in_tree)
    tl.store(OutValid + out + j, val.to(tl.int8), mask=in_tree)
    tl.store(OutScores + out + j, tl.load(Scores + row + j, mask=in_tree), mask=in_tree)
    i = t.to(tl.int64)
    parents = tl.where(i == depth, cur, N + i - 1)
    parents = tl.where(i < depth, 0, parents)
    new = out + N + t
    tl.store(OutTokens + new, chain, mask=in_chain)
    tl.store(OutParents + new, parents, mask=in_chain)
    tl.store(OutDepths + new, i + 1, mask=in_chain)
    tl.store(OutValid + new, ((i >= depth) & ok).to(tl.int8), mask=in_chain)
    tl.store(OutScores + new, tl.zeros([LP], tl.float32), mask=in_chain)


def lookup_graft_kernel(tree: DraftTree, history: torch.Tensor, seq_lens: torch.Tensor, bonus: torch.Tensor,
                        tokens: int) -> DraftTree:
    """`graft(tree, *lookup(history, seq_lens, bonus, tokens))` in one launch. history: [S, C] token ids
    (rows past a slot's length ignored); seq_lens, bonus: [S]; tree: S slots of N nodes."""
    if (NGRAM_MIN, NGRAM_MAX) != (1, 3):  # the kernel compares exactly the last 1-3 tokens
        raise NotImplementedError(f"lookup_graft_kernel matches suffixes of 1-3 tokens, not {NGRAM_MIN}-{NGRAM_MAX}")
    slots, size = tree.tokens.shape
    history = history if history.stride(1) == 1 else history.contiguous()
    fields = [f.contiguous() for f in (tree.tokens, tree.parents, tree.depths, tree.valid.view(torch.uint8),
                                       tree.scores)]
    width = size + tokens
    new = [torch.empty(slots, width, dtype=f.dtype, device=f.device) for f in fields]
    valid = new[3].view(torch.bool)
    _lookup_graft[(slots,)](
        history, history.stride(0), seq_lens, bonus, *fields, *new,
        history.shape[1], size, tokens,
        BLOCK=SCAN_BLOCK, NP=max(2, triton.next_power_of_2(size)), LP=max(2, triton.next_power_of_2(tokens)),
        num_warps=4)
    return DraftTree(tokens=new[0], parents=new[1], depths=new[2], valid=valid, scores=new[4],
                     max_depth=max(tree.max_depth, tokens), ranked_scores=tree.ranked_scores)
