"""The draft tree: DDTree's best-first tree under a node budget, and the walk that accepts a path.

Every function here is a fixed-shape tensor program (no host synchronisation, no data-dependent
shapes), so a whole round can later be captured in a CUDA graph. Node 0 of a tree is always the
root: the bonus token of the previous round, not yet in the target's KV cache.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from treeflash.sampling import vocab_max


@dataclass(frozen=True)
class DraftTree:
    """A batch of draft trees, one per slot, each with the root plus `budget` nodes.

    tokens, parents, depths, valid, scores: [S, 1 + budget]. Parents precede children (parent index <
    child index); the root is its own parent. Invalid nodes (a budget larger than the number of
    prefixes with non-zero draft probability) hang off the root and can never be accepted.
    """

    tokens: torch.Tensor
    parents: torch.Tensor
    depths: torch.Tensor
    valid: torch.Tensor
    scores: torch.Tensor
    max_depth: int  # static: deepest possible node
    # [S, D * budget] log-scores of every candidate the builder ranked, best first (None for a chain or
    # no draft): the first `budget` are the tree's nodes; the rest estimate what a larger budget adds.
    ranked_scores: torch.Tensor | None = None

    @property
    def size(self) -> int:
        return self.tokens.shape[1]


def root_only(bonus: torch.Tensor) -> DraftTree:
    """No draft at all: plain autoregressive decoding is a round over the root alone."""
    zeros = torch.zeros_like(bonus)[:, None]
    return DraftTree(bonus[:, None], zeros, zeros, torch.ones_like(zeros, dtype=torch.bool),
                     zeros.float(), max_depth=0)


def build_tree(bonus: torch.Tensor, logprobs: torch.Tensor, budget: int, branching: int | None = None) -> DraftTree:
    """DDTree: the `budget` most probable prefixes under the drafter's factorised distribution.

    bonus: [S] root tokens; logprobs: [S, D, V] draft log-probs for depths 1..D (float32).
    branching: children per node considered (default min(budget, V)); 1 gives the DFlash chain.

    Equivalent to DDTree's best-first heap, computed depth by depth: the best `budget` prefixes of
    depth d all extend one of the best `budget` prefixes of depth d-1 (a prefix scores at least as much
    as its extensions), so a beam of width `budget` per depth holds every candidate, and the global
    best `budget` among the D beams form the tree. Ties break towards shallower, then earlier
    candidates (stable sorts), which keeps the chosen set prefix-closed.
    """
    slots, depth_count, vocab = logprobs.shape
    k = min(branching or budget, vocab, budget)
    top_scores, top_tokens = logprobs.float().topk(k, dim=-1)  # [S, D, K], sorted descending
    neg_inf = torch.full((slots, budget), -torch.inf, device=logprobs.device)

    # Beam of depth 1: the root's K children, padded to the budget.
    beam_scores = neg_inf.clone()
    beam_scores[:, :k] = top_scores[:, 0]
    first_tokens = torch.zeros(slots, budget, dtype=torch.long, device=logprobs.device)
    first_tokens[:, :k] = top_tokens[:, 0]
    # Each depth ranks its candidate pairs and keeps the best `budget` (scores and which pair); tokens
    # and parents are looked up for all depths at once afterwards: on a GPU every op here is a kernel
    # launch that costs more than its work, so the loop holds only what depends on the previous beam.
    pairs, beam_of, child_of = _beam_pairs(budget, k, logprobs.device)
    scores, orders = [beam_scores], []
    for d in range(1, depth_count):
        candidates = (beam_scores[:, :, None] + top_scores[:, d, None, :]).flatten(1)[:, pairs]  # [S, pairs]
        if k == 1:  # a chain: the beam plus one child score each is still in order (the stable sort's)
            beam_scores = candidates
            orders.append(torch.arange(budget, device=logprobs.device).expand(slots, budget))
        else:
            ranked_pairs = candidates.sort(dim=-1, descending=True, stable=True)
            beam_scores = ranked_pairs.values[:, :budget]
            orders.append(ranked_pairs.indices[:, :budget])
        scores.append(beam_scores)
    if orders:
        order = torch.stack(orders, dim=1)  # [S, D-1, budget]: the pair each beam entry came from
        deeper_tokens = top_tokens[:, 1:].gather(2, child_of[order]).flatten(1)
        tokens = torch.cat([first_tokens, deeper_tokens], dim=1)
        parent_beams = torch.cat([torch.zeros_like(first_tokens), beam_of[order].flatten(1)], dim=1)
    else:
        tokens, parent_beams = first_tokens, torch.zeros_like(first_tokens)

    # Global choice among all depths; candidate c = d * budget + j (depth-major).
    all_scores = torch.cat(scores, dim=1)  # [S, D * budget]
    ranked = all_scores.sort(dim=-1, descending=True, stable=True)
    chosen = ranked.indices[:, :budget]
    chosen = chosen.sort(dim=-1).values  # depth-major order: parents before children
    node_of = torch.full_like(all_scores, -1, dtype=torch.long)
    node_of.scatter_(1, chosen, torch.arange(1, budget + 1, device=logprobs.device).expand(slots, budget))

    depth0 = chosen // budget  # 0-based depth of each chosen candidate
    parent_candidate = (depth0 - 1) * budget + parent_beams.gather(1, chosen)
    parent = node_of.gather(1, parent_candidate.clamp_min(0))
    node_scores = all_scores.gather(1, chosen)
    valid = node_scores > -torch.inf
    parent = torch.where((depth0 > 0) & valid, parent, 0)

    zero = torch.zeros(slots, 1, dtype=torch.long, device=logprobs.device)
    return DraftTree(
        tokens=torch.cat([bonus[:, None], tokens.gather(1, chosen)], dim=1),
        parents=torch.cat([zero, parent], dim=1),
        depths=torch.cat([zero, depth0 + 1], dim=1),
        valid=torch.cat([torch.ones_like(zero, dtype=torch.bool), valid], dim=1),
        scores=torch.cat([zero.float(), node_scores], dim=1),
        max_depth=depth_count,
        ranked_scores=ranked.values,
    )


def build_chain(bonus: torch.Tensor, logprobs: torch.Tensor) -> DraftTree:
    """The DFlash chain: the most probable token at every depth, each the child of the one before.

    The tree `build_tree(bonus, logprobs, budget=D, branching=1)` builds (its scores up to float rounding:
    a running sum here), in a handful of ops instead of its per-depth loop: on a GPU each op is a
    launch that costs more than its work. bonus: [S]; logprobs: [S, D, V].
    """
    slots, depth_count, _ = logprobs.shape
    best, tokens = vocab_max(logprobs)  # [S, D]
    scores = torch.cat([best.new_zeros(slots, 1), best.cumsum(dim=1)], dim=1)
    depths, parents = _chain_links(depth_count, logprobs.device)
    return DraftTree(
        tokens=torch.cat([bonus[:, None], tokens], dim=1),
        parents=parents.expand(slots, -1),
        depths=depths.expand(slots, -1),
        valid=scores > -torch.inf,
        scores=scores,
        max_depth=depth_count,
    )


@functools.cache  # never evicted: a captured CUDA graph keeps reading the tensors at their addresses
def _chain_links(depth_count: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """A chain's depths (node i at depth i) and parents (node i - 1; the root its own), made once per
    shape (the warm-up rounds run before any CUDA graph is captured); shared, so never written to."""
    depths = torch.arange(depth_count + 1, device=device)
    return depths, (depths - 1).clamp_min(0)


@functools.cache  # never evicted (as _chain_links); a few small tensors per (budget, k)
def _beam_pairs(budget: int, k: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The (beam entry i, child rank j) pairs that can make the next beam, in i-major order: their
    indices i * k + j among all pairs, their i, their j.

    Beam scores and child scores are both sorted descending, so the pairs (i', j') with i' <= i and
    j' <= j all score at least as much as (i, j) and come before it in i-major order: when there are
    `budget` of them or more ((i+1)(j+1) > budget), (i, j) cannot be among the `budget` best under the
    stable sort. Ranking only the rest (~budget * ln(budget) of budget * K pairs) picks the same beam
    in the same order, at a fraction of the sort. Cached: the tensors are made once, before any graph
    capture (the runner's warm-up rounds), never inside one.
    """
    pairs = [(i, j) for i in range(budget) for j in range(min(k, budget // (i + 1)))]
    beam_of, child_of = (torch.tensor(column, dtype=torch.long, device=device) for column in zip(*pairs))
    return beam_of * k + child_of, beam_of, child_of


def _doubling_passes(depth: int) -> int:
    return max(0, depth).bit_length()  # the least m with 2^m > depth


def ancestor_mask(tree: DraftTree) -> torch.Tensor:
    """[S, N, N] bool: node i sees node j iff j is i or an ancestor of i (the verify mask)."""
    slots, n = tree.parents.shape
    seen = torch.eye(n, dtype=torch.bool, device=tree.parents.device).expand(slots, n, n)
    # Pointer doubling: after pass m, `seen` holds the ancestors closer than 2^m and `up` is each node's
    # 2^m-th ancestor (the root is its own parent), so ceil(log2(D + 1)) passes cover depth D.
    up = tree.parents
    for _ in range(_doubling_passes(tree.max_depth)):
        seen = seen | seen.gather(1, up[:, :, None].expand(slots, n, n))
        up = up.gather(1, up)
    return seen


@dataclass(frozen=True)
class Walk:
    """The accepted path of each slot. path: [S, D+1] node indices by depth (entries past `accepted`
    are 0); accepted: [S] nodes on the path including the root (= tokens emitted this round);
    emitted: [S, D+1] the tokens emitted, the last valid one being the new bonus token."""

    path: torch.Tensor
    accepted: torch.Tensor
    emitted: torch.Tensor


def walk(tree: DraftTree, derived: torch.Tensor) -> Walk:
    """From the root, follow the child whose token equals the token derived at the current node.

    derived: [S, N] one target token per node. Siblings are distinct, so at most one child matches
    and the accepted nodes form one path from the root.
    """
    matches = tree.valid & (tree.tokens == derived.gather(1, tree.parents))
    accepted = matches.clone()
    accepted[:, 0] = True
    up = tree.parents  # a node is accepted iff it and every ancestor match: pointer doubling, as above
    for _ in range(_doubling_passes(tree.max_depth)):
        accepted = accepted & accepted.gather(1, up)
        up = up.gather(1, up)
    depth_ids = torch.arange(tree.max_depth + 1, device=derived.device)
    on_path = accepted[:, None, :] & (tree.depths[:, None, :] == depth_ids[None, :, None])  # [S, D+1, N]
    path = on_path.int().argmax(-1)
    return Walk(path=path, accepted=accepted.sum(1), emitted=derived.gather(1, path))
