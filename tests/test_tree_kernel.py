"""DDTree's builder as one Triton kernel (treeflash/tree_kernel.py), run by Triton's interpreter on CPU
tensors: field for field the tree `build_tree` builds, ties and invalid nodes included."""

from __future__ import annotations

import pytest
import torch

from triton_interpreter import mend  # noqa: F401  (first: it turns the interpreter on)
from treeflash.tree import build_tree
from treeflash.tree_kernel import build_tree_kernel, top_k_kernel

FIELDS = ("tokens", "parents", "depths", "valid", "scores", "ranked_scores")
pytestmark = pytest.mark.usefixtures("mend")


@pytest.mark.parametrize("slots,depth,vocab,budget,levels", [
    (1, 3, 10, 4, None),
    (2, 5, 40, 8, 3),  # 3 levels: few distinct log-probs, ties everywhere
    (2, 6, 60, 32, None),
    (2, 4, 6, 24, 2),  # a budget past the vocabulary (K < budget)
    (1, 1, 5, 3, None),  # one depth: no beam step
    (2, 6, 50, 1, None),
])
def test_kernel_builds_build_trees_tree(slots, depth, vocab, budget, levels):
    gen = torch.Generator().manual_seed(budget)
    lp = torch.randn(slots, depth, vocab, generator=gen)
    if levels:
        lp = (lp * levels).round() / levels
    lp = lp.log_softmax(-1)
    bonus = torch.arange(slots) + 7
    # Ties: both builders from torch.topk's lists (the kernel's own top-k orders equal scores by token).
    top = lp.topk(min(budget, vocab), dim=-1) if levels else None
    want, got = build_tree(bonus, lp, budget), build_tree_kernel(bonus, lp, budget, top=top)
    for field in FIELDS:
        assert torch.equal(getattr(got, field), getattr(want, field)), field


def reference_top_k(lp: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    # Descending, equal scores by the lower token: a stable sort of the negated scores.
    order = (-lp.float()).sort(dim=-1, stable=True).indices[..., :k]
    return lp.float().gather(-1, order), order


@pytest.mark.parametrize("slots,depth,vocab,k,levels,dtype", [
    (1, 3, 5000, 16, None, torch.float32),  # three chunks of 2048, the last partial
    (2, 4, 300, 7, 2, torch.float32),  # ties everywhere, k not a power of two
    (2, 2, 4096, 64, None, torch.bfloat16),  # read as bf16, no float32 copy
    (1, 2, 20, 20, 1, torch.float32),  # k = V
    (3, 2, 1000, 1, None, torch.float32),  # the chain's argmax
])
def test_top_k_kernel_is_a_stable_top_k(slots, depth, vocab, k, levels, dtype):
    gen = torch.Generator().manual_seed(vocab + k)
    lp = torch.randn(slots, depth, vocab, generator=gen) * 3
    if levels:
        lp = (lp * levels).round() / levels
    lp = lp.log_softmax(-1).to(dtype)
    lp[0, 0, :vocab // 3] = float("-inf")  # probability zero
    scores, tokens = top_k_kernel(lp, k)
    want_scores, want_tokens = reference_top_k(lp, k)
    assert torch.equal(scores, want_scores) and torch.equal(tokens, want_tokens)
    if not levels and dtype == torch.float32:  # no ties (bf16 has them): what torch.topk gives
        ts, tt = lp.float().topk(k, dim=-1)
        assert torch.equal(scores, ts) and torch.equal(tokens, tt)


def test_top_k_kernel_reads_strided_rows():
    lp = torch.randn(2, 6, 3000).log_softmax(-1)[:, ::2]  # depths strided, rows contiguous
    scores, tokens = top_k_kernel(lp, 32)
    want_scores, want_tokens = reference_top_k(lp, 32)
    assert torch.equal(scores, want_scores) and torch.equal(tokens, want_tokens)


def test_kernel_with_more_nodes_than_prefixes():
    lp = torch.full((2, 3, 8), float("-inf"))
    lp[:, :, :2] = torch.tensor([-0.1, -2.4])  # two tokens per depth with any probability: 14 prefixes
    top = lp.topk(8, dim=-1)  # the -inf tokens tie: both builders from the same lists
    want, got = build_tree(torch.tensor([1, 2]), lp, 20), build_tree_kernel(torch.tensor([1, 2]), lp, 20, top=top)
    assert int(want.valid.sum()) == 2 * (1 + 14)
    for field in FIELDS:
        assert torch.equal(getattr(got, field), getattr(want, field)), field


@pytest.mark.parametrize("budget", [4, 8, 16])
def test_kernel_ranks_certain_tokens_first(budget):
    # A drafter sure of a token gives it a log-prob of exactly 0.0, so prefixes of them score +0.0: the
    # top of every ranking, where a key that put the score's bits in the sign bit ranked them last.
    gen = torch.Generator().manual_seed(budget)
    lp = torch.randn(3, 5, 50, generator=gen)
    lp[0, :, 3] = 200.0  # certain at every depth
    lp[1, :2, 8] = 200.0  # certain at the first two depths only
    lp = lp.log_softmax(-1)
    assert lp[0].max() == 0.0 and lp[1, :2].max() == 0.0
    bonus = torch.tensor([7, 8, 9])
    want, got = build_tree(bonus, lp, budget), build_tree_kernel(bonus, lp, budget)
    nodes = set(zip(want.depths[0].tolist(), want.tokens[0].tolist()))
    assert {(d, 3) for d in range(1, min(5, budget) + 1)} <= nodes  # the certain chain is in the tree
    for field in FIELDS:
        assert torch.equal(getattr(got, field), getattr(want, field)), field


@pytest.mark.parametrize("vocab,k,pieces", [(5000, 16, 1), (5000, 16, 4), (300, 8, 16), (20, 20, 8)])
def test_top_k_kernel_pieces(vocab, k, pieces):
    # However a row is split (pieces past its end hold nothing), the merged top-k is the row's.
    lp = (torch.randn(2, 3, vocab, generator=torch.Generator().manual_seed(vocab)) * 2).round().log_softmax(-1)
    scores, tokens = top_k_kernel(lp, k, pieces=pieces)
    want_scores, want_tokens = reference_top_k(lp, k)
    assert torch.equal(scores, want_scores) and torch.equal(tokens, want_tokens)
