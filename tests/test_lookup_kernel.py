"""Prompt lookup and its graft as one Triton kernel (treeflash/lookup_kernel.py), run by Triton's
interpreter on CPU tensors: field for field the tree `graft(tree, *lookup(...))` gives, invalid nodes
(their tokens and parents too) included."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from triton_interpreter import mend  # noqa: F401  (first: it turns the interpreter on)
from treeflash.lookup import graft, graft_lookup, lookup
from treeflash.tree import build_chain, build_tree, root_only

FIELDS = ("tokens", "parents", "depths", "valid", "scores", "ranked_scores")
pytestmark = pytest.mark.usefixtures("mend")


def assert_same(got, want):
    for field in FIELDS:
        a, b = getattr(got, field), getattr(want, field)
        assert (a is None and b is None) or (a.dtype == b.dtype and torch.equal(a, b)), field
    assert got.max_depth == want.max_depth


def trees(bonus, gen, vocab):
    slots = bonus.shape[0]
    logprobs = torch.randn(slots, 4, vocab, generator=gen).log_softmax(-1)
    return [root_only(bonus), build_chain(bonus, logprobs), build_tree(bonus, logprobs, budget=12),
            build_tree(bonus, logprobs, budget=3)]


@pytest.mark.parametrize("seed", range(6))
def test_kernel_grafts_what_the_torch_ops_graft(seed):
    gen = torch.Generator().manual_seed(seed)
    slots, capacity, vocab = 4, [7, 40, 1, 300, 2, 2100][seed], [3, 4, 2, 5, 3, 6][seed]
    history = torch.randint(0, vocab, (slots, capacity), generator=gen)
    # Every length from empty to a full history (the root then sits in lookup's extra column).
    seq_lens = torch.tensor([0, capacity, min(1, capacity), capacity // 2])
    bonus = torch.randint(0, vocab, (slots,), generator=gen)
    for tree in trees(bonus, gen, vocab):
        for tokens in (1, 5, 8):
            want = graft(tree, *lookup(history, seq_lens, bonus, tokens))
            assert_same(graft_lookup(tree, history, seq_lens, bonus, tokens, kernel=True), want)


def test_kernel_extends_the_path_the_chain_already_spells():
    # Histories made to repeat the tree's own first path, so the chain merges into the tree at depth >= 1.
    gen = torch.Generator().manual_seed(11)
    bonus = torch.tensor([1, 2, 0])
    tree = build_tree(bonus, torch.randn(3, 4, 4, generator=gen).log_softmax(-1), budget=10)
    rows = []
    for s in range(3):
        path, node = [], 0
        while len(path) < 3:
            kids = [c for c in range(1, tree.size) if tree.parents[s, c] == node and tree.valid[s, c]]
            if not kids:
                break
            node = kids[0]
            path.append(int(tree.tokens[s, node]))
        rows.append([int(bonus[s])] + path + [3, 1, int(bonus[s])])
    width = max(map(len, rows))
    history = torch.tensor([r + [0] * (width - len(r)) for r in rows])
    seq_lens = torch.tensor([len(r) for r in rows])
    want = graft(tree, *lookup(history, seq_lens, bonus, 6))
    assert int((want.valid[:, tree.size:] == 0).sum()) > 0  # some chain tokens merged into tree paths
    assert_same(graft_lookup(tree, history, seq_lens, bonus, 6, kernel=True), want)


def test_kernel_reads_a_slice_of_a_wider_history():
    # A round passes history[:num_slots] of the runner's buffer, and a draft-vocabulary tree's tokens.
    gen = torch.Generator().manual_seed(5)
    history = torch.randint(0, 5, (6, 50), generator=gen)[:4]
    seq_lens, bonus = torch.tensor([10, 49, 50, 3]), torch.tensor([0, 1, 2, 0])
    tree = build_tree(bonus, torch.randn(4, 3, 5, generator=gen).log_softmax(-1), budget=6)
    drafted = torch.tensor([2, 0, 1, 4, 3])[tree.tokens[:, 1:]]  # a draft vocabulary's ids, mapped back
    tree = dataclasses.replace(tree, tokens=torch.cat([tree.tokens[:, :1], drafted], 1))
    assert_same(graft_lookup(tree, history, seq_lens, bonus, 4, kernel=True),
                graft(tree, *lookup(history, seq_lens, bonus, 4)))
