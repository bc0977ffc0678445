"""Prompt lookup: a draft chain copied from earlier in the sequence, grafted onto a round's tree.

Text often repeats what came before it: code reuses its identifiers and lines, answers quote the question,
a small model at temperature 0 loops. Where the sequence's last few tokens occurred before, the tokens
that followed them then are a guess at what follows now, at no model cost (vLLM's "ngram" speculation).
`lookup` finds, per slot, the most recent earlier occurrence of the sequence's last NGRAM_MAX tokens
(then fewer, down to NGRAM_MIN) and returns the tokens after it; `graft` adds them to the draft tree as a
chain below the deepest node whose path they already spell, so a tree path and a copied continuation
extend each other and siblings stay distinct (what `tree.walk` relies on).

Verification does not care where a node came from, so this is exactly as lossless as the tree it joins:
greedy output is plain decoding's, sampled output the target's distribution. Everything is fixed-shape
tensor work over the slot's token history (no host synchronisation, capturable in CUDA graphs).
"""

from __future__ import annotations

import torch

from treeflash.tree import DraftTree, _doubling_passes

NGRAM_MAX = 3  # the longest suffix matched (then shorter ones)
NGRAM_MIN = 1


def lookup(history: torch.Tensor, seq_lens: torch.Tensor, bonus: torch.Tensor, tokens: int
           ) -> tuple[torch.Tensor, torch.Tensor]:
    """The copied continuation of every slot's sequence: its committed tokens history[s, :seq_lens[s]]
    followed by the root token `bonus[s]`.

    history: [S, C] token ids (rows past a slot's length are ignored); seq_lens, bonus: [S].
    Returns (tokens [S, L], ok [S, L] bool): the L = `tokens` tokens after the most recent earlier
    occurrence of the sequence's last n tokens, for the largest n in [NGRAM_MIN, NGRAM_MAX] that has one;
    ok is False past the sequence's end and where nothing matched.
    """
    n = seq_lens + 1  # the sequence's length, root included
    seq = torch.cat([history, history[:, :1]], 1)  # one more row: the root of a full history goes there
    seq = seq.scatter(1, seq_lens[:, None], bonus[:, None])
    width = seq.shape[1]
    j = torch.arange(width, device=history.device)
    shifted = [seq.roll(-i, 1) for i in range(NGRAM_MAX)]  # shifted[i][:, j] = seq[:, j + i] (wrapped: masked)
    best = torch.full_like(seq_lens, -1)  # start of the chosen occurrence's continuation, -1: none yet
    for k in range(NGRAM_MAX, NGRAM_MIN - 1, -1):
        # An occurrence at j..j+k-1 with its continuation j+k inside the sequence, not the suffix itself.
        hit = (j[None, :] + k < n[:, None]) & (n[:, None] >= k + 1)
        for i in range(k):
            suffix = seq.gather(1, (n - k + i).clamp_min(0)[:, None])  # [S, 1]
            hit &= shifted[i] == suffix
        latest = torch.where(hit, j[None, :], -1).amax(1)  # the most recent occurrence, or -1
        best = torch.where((best < 0) & (latest >= 0), latest + k, best)
    at = best[:, None] + torch.arange(tokens, device=history.device)
    ok = (best[:, None] >= 0) & (at < n[:, None])
    return seq.gather(1, at.clamp(0, width - 1)), ok


def graft(tree: DraftTree, chain: torch.Tensor, ok: torch.Tensor) -> DraftTree:
    """`tree` with the chain [S, L] (valid where `ok`, a prefix) below the root, merged: the chain's first
    d tokens that some tree path already spells stay that path, the rest become L new nodes' last L - d
    (the first d new nodes are invalid). New nodes take parents before them and depths 1..L."""
    slots, size = tree.tokens.shape
    length = chain.shape[1]
    device = chain.device
    # A node is on the chain when its token is the chain's at its depth and its parent is on it too.
    at_depth = chain.gather(1, (tree.depths - 1).clamp(0, length - 1))
    okay = ok.gather(1, (tree.depths - 1).clamp(0, length - 1)) & (tree.depths <= length)
    on = tree.valid & okay & (tree.tokens == at_depth)
    on[:, 0] = True
    up = tree.parents
    for _ in range(_doubling_passes(tree.max_depth)):
        on = on & on.gather(1, up)
        up = up.gather(1, up)
    deepest = torch.where(on, tree.depths, -1).argmax(1)  # [S] (depths along one path are distinct)
    matched = tree.depths.gather(1, deepest[:, None])  # [S, 1]: d
    i = torch.arange(length, device=device)[None, :]
    new_ids = size + i
    parents = torch.where(i == matched, deepest[:, None], new_ids - 1)
    parents = torch.where(i < matched, 0, parents)  # invalid nodes hang off the root
    valid = (i >= matched) & ok
    scores = torch.zeros(slots, length, dtype=tree.scores.dtype, device=device)
    return DraftTree(tokens=torch.cat([tree.tokens, chain], 1), parents=torch.cat([tree.parents, parents], 1),
                     depths=torch.cat([tree.depths, (i + 1).expand(slots, length)], 1),
                     valid=torch.cat([tree.valid, valid], 1), scores=torch.cat([tree.scores, scores], 1),
                     max_depth=max(tree.max_depth, length), ranked_scores=tree.ranked_scores)
