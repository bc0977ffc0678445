"""The walk and the ancestor mask as Triton kernels (treeflash/walk_kernel.py), run by Triton's interpreter on
CPU tensors: element for element what `walk` and `ancestor_mask` give, on every kind of tree a round makes."""

from __future__ import annotations

import pytest
import torch

from triton_interpreter import mend  # noqa: F401  (first: it turns the interpreter on)
from treeflash.lookup import graft_lookup
from treeflash.tree import ancestor_mask, build_chain, build_tree, root_only, walk
from treeflash.walk_kernel import ancestor_mask_kernel, walk_kernel

pytestmark = pytest.mark.usefixtures("mend")


def trees(slots: int, depth: int, vocab: int, gen: torch.Generator):
    bonus = torch.randint(0, vocab, (slots,), generator=gen)
    logprobs = torch.randn(slots, depth, vocab, generator=gen).log_softmax(-1)
    out = {"root": root_only(bonus), "chain": build_chain(bonus, logprobs)}
    for budget in (1, 3, 12, 64, 200):
        out[f"tree{budget}"] = build_tree(bonus, logprobs, budget=budget)
    # Prompt lookup grafted (a chain under the root that may run along a tree path, past the tree's depth).
    history = torch.randint(0, 3, (slots, 40), generator=gen)
    out["tree12+lookup"] = graft_lookup(out["tree12"], history, torch.tensor([30, 5, 39][:slots]), bonus, depth + 3)
    return out


def derived_along(tree, gen: torch.Generator, follow: float) -> torch.Tensor:
    """The target's token at each node: with probability `follow` a child's token (so paths are accepted
    deep), else a random one."""
    slots, n = tree.tokens.shape
    derived = torch.randint(0, 50, (slots, n), generator=gen)
    for s in range(slots):
        for child in torch.randperm(n, generator=gen).tolist():
            if child and torch.rand((), generator=gen) < follow:
                derived[s, tree.parents[s, child]] = tree.tokens[s, child]
    return derived


@pytest.mark.parametrize("seed", range(4))
def test_walk_kernel_is_walk(seed):
    gen = torch.Generator().manual_seed(seed)
    slots, depth, vocab = [(1, 5, 7), (3, 15, 4), (2, 6, 30), (3, 2, 3)][seed]
    for name, tree in trees(slots, depth, vocab, gen).items():
        for follow in (0.0, 0.5, 1.0):
            derived = derived_along(tree, gen, follow)
            want, got = walk(tree, derived), walk_kernel(tree, derived)
            for field in ("path", "accepted", "emitted"):
                a, b = getattr(got, field), getattr(want, field)
                assert a.dtype == b.dtype and torch.equal(a, b), (name, follow, field)


@pytest.mark.parametrize("seed", range(3))
def test_ancestor_mask_kernel_is_ancestor_mask(seed):
    gen = torch.Generator().manual_seed(seed)
    slots, depth, vocab = [(1, 5, 7), (3, 15, 4), (2, 6, 30)][seed]
    for name, tree in trees(slots, depth, vocab, gen).items():
        want, got = ancestor_mask(tree), ancestor_mask_kernel(tree)
        assert got.dtype == torch.bool and torch.equal(got, want), name


def test_walk_kernel_accepts_a_whole_chain():
    gen = torch.Generator().manual_seed(0)
    bonus = torch.tensor([3, 4])
    tree = build_chain(bonus, torch.randn(2, 6, 9, generator=gen).log_softmax(-1))
    derived = torch.cat([tree.tokens[:, 1:], torch.tensor([[8], [1]])], 1)  # every draft is the target's token
    got = walk_kernel(tree, derived)
    assert got.accepted.tolist() == [7, 7]
    assert torch.equal(got.path, torch.arange(7).expand(2, 7))
    assert torch.equal(got.emitted, derived)


def test_path_kernels_on_cuda_only_unless_turned_off():
    from treeflash.round import use_path_kernels

    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert use_path_kernels(None, cuda) and use_path_kernels(True, cuda)
    assert not use_path_kernels(False, cuda)  # LLM(tree_kernel=False): the torch ops everywhere
    assert not any(use_path_kernels(setting, cpu) for setting in (None, True, False))
