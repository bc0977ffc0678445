"""DDTree's builder as one Triton kernel (treeflash/tree_kernel.py), run by Triton's interpreter on CPU
tensors: field for field the tree `build_tree` builds, ties and invalid nodes included."""

from __future__ import annotations

import os

import pytest
import torch

os.environ["TRITON_INTERPRET"] = "1"  # before the kernel is defined
pytest.importorskip("triton")

from treeflash.tree import build_tree  # noqa: E402
from treeflash.tree_kernel import build_tree_kernel  # noqa: E402

FIELDS = ("tokens", "parents", "depths", "valid", "scores", "ranked_scores")


@pytest.fixture(autouse=True)
def _interpreter_scalars(monkeypatch):
    # As in test_splitkv_attention: Triton 3.6's interpreter and NumPy >= 2.4 disagree on int(1-element array).
    from triton.runtime import interpreter

    original = getattr(interpreter, "_patch_lang_tensor", None)
    if original is None:  # another Triton: nothing to mend
        return

    def patch(tensor, scope):
        original(tensor, scope)
        tensor.__index__ = lambda self: int(self.handle.data.item())

    monkeypatch.setattr(interpreter, "_patch_lang_tensor", patch)


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
    want, got = build_tree(bonus, lp, budget), build_tree_kernel(bonus, lp, budget)
    for field in FIELDS:
        assert torch.equal(getattr(got, field), getattr(want, field)), field


def test_kernel_with_more_nodes_than_prefixes():
    lp = torch.full((2, 3, 8), float("-inf"))
    lp[:, :, :2] = torch.tensor([-0.1, -2.4])  # two tokens per depth with any probability: 14 prefixes
    want, got = build_tree(torch.tensor([1, 2]), lp, 20), build_tree_kernel(torch.tensor([1, 2]), lp, 20)
    assert int(want.valid.sum()) == 2 * (1 + 14)
    for field in FIELDS:
        assert torch.equal(getattr(got, field), getattr(want, field)), field
