"""DDTree's builder as one Triton kernel (treeflash/tree_kernel.py), run by Triton's interpreter on CPU
tensors: field for field the tree `build_tree` builds, ties and invalid nodes included."""

from __future__ import annotations

import pytest
import torch

from triton_interpreter import mend  # noqa: F401  (first: it turns the interpreter on)
from treeflash.tree import build_tree
from treeflash.tree_kernel import build_tree_kernel

FIELDS = ("tokens", "parents", "depths", "valid", "scores", "ranked_scores")
pytestmark = pytest.mark.usefixtures("mend")


@pytest.mark.parametrize("slots,depth,vocab,budget,levels", [
    (1, 3, 10, 4, None),
    (2, 5, 40, 8, 3),  # 3 levels: few distinct log-probs, ties everywhere
    (2, 6, 60, 32, None),
    (2, 4, 6, 24, 2),  # a budget past the vocabulary (K < budget)
    (1, 1, 5, 3, None),  # one depth: no beam step
    (2, 6, 50, 1, None),
    (1, 4, 300, 128, None),  # past 64 nodes (the default's reach since budget 256): a 128-wide beam
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
