"""Prompt lookup: a draft chain copied from earlier in the sequence, grafted onto a round's tree.

Text often repeats what came before it: code reuses its identifiers and lines, answers quote the question,
a small model at temperature 0 loops. Where the sequence's last few tokens occurred before, the tokens
that followed them then are a guess at what follows now, at no model cost (vLLM's "ngram" speculation).
`lookup` finds, per slot, the most recent earlier occurrence of the sequence's last NGRAM_MAX tokens
(then fewer, down to NGRAM_MIN) and returns the tokens after it; `graft` adds them to the draft tree as a
chain below the deepest node whose path they already spell, so a tree path and a copied continuation
extend each other and siblings stay distinct (what `tree.walk` relies on).

`graft_lookup` is what a round calls: on CUDA one Triton kernel does both (treeflash/lookup_kernel.py,
the same tree field for field), elsewhere these torch ops, which stay the reference. A CPU round then
`compact`s the result: the lookup rows left invalid (no earlier occurrence, or the part a tree path already
spells) and those of sampled requests are dropped before the verify, where each row costs its share.

Verification does not care where a node came from, so this is exactly as lossless as the tree it joins:
greedy output is plain decoding's, sampled output the target's distribution. Everything but `compact`
(one host read, CPU rounds only) is fixed-shape tensor work over the slot's token history (no host
synchronisation, capturable in CUDA graphs).
"""

from __future__ import annotations

import dataclasses

import torch

from treeflash.tree import DraftTree, _doubling_passes

NGRAM_MAX = 3  # the longest suffix matched (then shorter ones)
NGRAM_MIN = 1
# Lookup tokens a round grafts by default where a drafter drafts. On CUDA (one kernel) with the shipped pair on
# an H100, DDTree-64 with 8 of them ran 1.10x / 1.06x / 1.01x its tokens/s alone at batch 1 (HumanEval, MT-Bench,
# MT-Bench at T=1) and 1.00x / 1.03x at batch 32 (benchmarks/gpu-lookup-kernel/). On the CPU, where a round
# verifies only the valid lookup rows of greedy slots (`compact`), DDTree at the automatic budget ran 1.21x on
# greedy HumanEval and 0.99-1.02x on greedy MT-Bench, and sampled requests are left as they were
# (benchmarks/cpu-lookup-tokens/, benchmarks/cpu-lookup-greedy/). Not for spec="none", which stays plain decoding.
DEFAULT_TOKENS = 8


def default_tokens(method: str) -> int:
    """Prompt-lookup tokens a round grafts when the caller leaves it unsaid (`LLM(ngram_tokens=None)`): 8 where a
    drafter drafts, on any device; 0 for plain decoding."""
    return DEFAULT_TOKENS if method != "none" else 0


def lookup(history: torch.Tensor, seq_lens: torch.Tensor, bonus: torch.Tensor, tokens: int
           ) -> tuple[torch.Tensor, torch.Tensor]:
    """The copied continuation of every slot's sequence: its committed tokens history[s, :seq_lens[s]]
    followed by the root token `bonus[s]`.

    history: [S, C] token ids (rows past a slot's length are ignored); seq_lens, bonus: [S].
    Returns (tokens [S, L], ok [S, L] bool): the L = `tokens` tokens after the most recent earlier
    occurrence of the sequence's last n tokens, for the largest n in [NGRAM_MIN, NGRAM_MAX] that has one;
    ok is False past the sequence's end and where nothing matched, and the token there is 0.
    """
    n = seq_lens + 1  # the sequence's length, root included
    seq = torch.cat([history, history[:, :1]], 1)  # one more row: the root of a full history goes there
    seq = seq.scatter(1, seq_lens[:, None], bonus[:, None])
    width = seq.shape[1]
    # A few whole-width ops, not one per (n, token) pair: on a GPU each op is a launch, and launches, not
    # bytes, are what a round of a small model costs. ending[s, e, i] = seq[s, e - i] (-1 before the start).
    back = torch.arange(NGRAM_MAX, device=history.device)
    suffix = seq.gather(1, (n[:, None] - 1 - back).clamp_min(0))  # [S, NGRAM_MAX]: seq[n - 1 - i]
    ending = torch.nn.functional.pad(seq, (NGRAM_MAX - 1, 0), value=-1).unfold(1, NGRAM_MAX, 1).flip(-1)
    # How many of the sequence's last tokens the tokens ending at e repeat; an occurrence counts only with
    # its continuation e + 1 inside the sequence (so never the suffix itself).
    j = torch.arange(width, device=history.device)
    matched = (ending == suffix[:, None, :]).cumprod(-1).sum(-1)
    matched = torch.where(j[None, :] <= n[:, None] - 2, matched, 0)
    # The longest match first, then the most recent: one max over length * width + end.
    best = (matched * width + j[None, :]).amax(1)
    found = best >= NGRAM_MIN * width
    at = (best % width + 1)[:, None] + torch.arange(tokens, device=history.device)
    ok = found[:, None] & (at < n[:, None])
    # Token 0 where not ok: the rows past the sequence's end hold whatever earlier rounds (or a CUDA graph's
    # warm-up) wrote there; never accepted, but a tree made of them would differ run to run.
    return torch.where(ok, seq.gather(1, at.clamp_max(width - 1)), 0), ok


def graft(tree: DraftTree, chain: torch.Tensor, ok: torch.Tensor) -> DraftTree:
    """`tree` with the chain [S, L] (valid where `ok`, a prefix) below the root, merged: the chain's first
    d tokens that some tree path already spells stay that path, the rest become L new nodes' last L - d
    (the first d new nodes are invalid). New nodes take parents before them and depths 1..L."""
    slots, size = tree.tokens.shape
    length = chain.shape[1]
    device = chain.device
    # A node is on the chain when its token is the chain's at its depth and its parent is on it too
    # (a token past the valid chain is -1: no node's).
    at_depth = torch.where(ok, chain, -1).gather(1, (tree.depths - 1).clamp(0, length - 1))
    on = tree.valid & (tree.tokens == at_depth) & (tree.depths <= length)
    on[:, 0] = True
    up = tree.parents
    for p in range(passes := _doubling_passes(tree.max_depth)):
        on = on & on.gather(1, up)
        if p + 1 < passes:
            up = up.gather(1, up)
    # The deepest node on the chain (depths along one path are distinct) and its depth d.
    matched, deepest = torch.where(on, tree.depths, -1).max(1, keepdim=True)
    i = torch.arange(length, device=device)[None, :]
    new_ids = size + i
    parents = torch.where(i == matched, deepest, new_ids - 1)
    parents = torch.where(i < matched, 0, parents)  # invalid nodes hang off the root
    valid = (i >= matched) & ok
    return DraftTree(tokens=torch.cat([tree.tokens, chain], 1), parents=torch.cat([tree.parents, parents], 1),
                     depths=torch.cat([tree.depths, (i + 1).expand(slots, length)], 1),
                     valid=torch.cat([tree.valid, valid], 1), scores=torch.nn.functional.pad(tree.scores, (0, length)),
                     max_depth=max(tree.max_depth, length), ranked_scores=tree.ranked_scores)


def compact(tree: DraftTree, size: int, keep: torch.Tensor | None = None) -> DraftTree:
    """`tree` (a graft's output) with its lookup nodes, rows [size:], cut to the valid ones: each slot's
    valid lookup nodes (a contiguous run: `graft` leaves invalid the chain's part a tree path already
    spells and what is past the match) move to the front of those rows, and the rows end at the most
    any slot keeps. The same tree, node for node (parents renumbered, depths kept, so derive's draws,
    keyed by position, are too); fewer rows to verify. keep: [S] bool, the slots whose lookup nodes stay
    (default all); the others' are dropped too.

    Reads that count on the host: for eager rounds on the CPU, where a verified row costs its share of
    the round (55% of MT-Bench rounds find no earlier occurrence at all). A CUDA round keeps its fixed
    shape (no host read inside a round; a graph's rows are fixed).
    """
    if keep is not None:
        tree = keep_slots(tree, size, keep)
    valid = tree.valid[:, size:]
    kept = valid.sum(1)
    width = int(kept.max())  # the host read
    if width == valid.shape[1]:
        return tree
    # Where each slot's run starts (the first valid lookup row; any row where none is valid).
    start = torch.where(valid.any(1), valid.int().argmax(1), 0)
    j = torch.arange(width, device=valid.device)[None, :]
    source = size + (start[:, None] + j).clamp_max(valid.shape[1] - 1)
    keep = j < kept[:, None]
    parents = tree.parents.gather(1, source)
    parents = torch.where(parents >= size, parents - start[:, None], parents)  # a run's nodes chain on
    parents = torch.where(keep, parents, 0)

    def rows(t: torch.Tensor) -> torch.Tensor:
        return torch.cat([t[:, :size], t.gather(1, source)], 1)

    return DraftTree(tokens=rows(tree.tokens), depths=rows(tree.depths), scores=rows(tree.scores),
                     parents=torch.cat([tree.parents[:, :size], parents], 1),
                     valid=torch.cat([tree.valid[:, :size], keep], 1), max_depth=tree.max_depth,
                     ranked_scores=tree.ranked_scores)


def keep_slots(tree: DraftTree, size: int, slots: torch.Tensor) -> DraftTree:
    """`tree` with the lookup nodes (rows [size:]) of the slots not in `slots` ([S] bool) made invalid."""
    valid = torch.cat([tree.valid[:, :size], tree.valid[:, size:] & slots[:, None]], 1)
    return dataclasses.replace(tree, valid=valid)


def graft_lookup(tree: DraftTree, history: torch.Tensor, seq_lens: torch.Tensor, bonus: torch.Tensor, tokens: int,
                 kernel: bool | None = None) -> DraftTree:
    """`graft(tree, *lookup(history, seq_lens, bonus, tokens))`: on CUDA as one Triton kernel
    (treeflash/lookup_kernel.py), else as the torch ops above. kernel: force it on (also under Triton's
    interpreter, for tests) or off; None picks it on CUDA."""
    if kernel is None:
        kernel = history.device.type == "cuda"
    if kernel:
        from treeflash.lookup_kernel import lookup_graft_kernel

        return lookup_graft_kernel(tree, history, seq_lens, bonus, tokens)
    return graft(tree, *lookup(history, seq_lens, bonus, tokens))
