"""DDTree construction, the verify mask and the walk, against brute force and hand-made trees."""

from __future__ import annotations

import itertools

import pytest
import torch

from treeflash.tree import DraftTree, ancestor_mask, build_tree, root_only, walk


# --- helpers ----------------------------------------------------------------------------------------
def random_logprobs(slots: int, depth: int, vocab: int, seed: int, spread: float = 2.0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (spread * torch.randn(slots, depth, vocab, generator=g)).log_softmax(-1).float()


def brute_force_prefixes(lp: torch.Tensor, branching: int | None = None) -> list[tuple[float, int, tuple[int, ...]]]:
    """Every prefix of depth 1..D with its factorised score, summed in float32 in depth order.

    lp: [D, V]. With `branching`, only the top-`branching` tokens of each depth are allowed.
    Prefixes of probability zero (score -inf) are left out. Sorted best first.
    """
    depth, vocab = lp.shape
    allowed = [lp[d].topk(branching).indices.tolist() if branching else range(vocab) for d in range(depth)]
    out = []
    for d in range(1, depth + 1):
        for path in itertools.product(*allowed[:d]):
            score = lp[0, path[0]].clone()
            for i in range(1, d):
                score = score + lp[i, path[i]]  # float32, same association as the beam
            if score.item() > -float("inf"):
                out.append((score.item(), d, path))
    out.sort(key=lambda x: -x[0])
    return out


def node_paths(tree: DraftTree, s: int) -> dict[int, tuple[int, ...]]:
    """Token path (excluding the root) of every valid non-root node of slot s."""
    tokens, parents, valid = tree.tokens[s].tolist(), tree.parents[s].tolist(), tree.valid[s].tolist()
    paths = {0: ()}
    for i in range(1, tree.size):
        if valid[i]:
            assert parents[i] in paths, f"node {i}'s parent {parents[i]} is not an earlier valid node"
            paths[i] = paths[parents[i]] + (tokens[i],)
    del paths[0]
    return paths


def check_structure(tree: DraftTree, lp: torch.Tensor, bonus: torch.Tensor) -> None:
    """Invariants every built tree must satisfy (lp: [S, D, V])."""
    slots, n = tree.tokens.shape
    assert tree.parents.shape == tree.depths.shape == tree.valid.shape == tree.scores.shape == (slots, n)
    assert torch.equal(tree.tokens[:, 0], bonus)
    assert (tree.parents[:, 0] == 0).all() and (tree.depths[:, 0] == 0).all() and tree.valid[:, 0].all()
    idx = torch.arange(n)
    assert (tree.parents[:, 1:] < idx[1:]).all(), "a parent must precede its child"
    assert (tree.depths <= tree.max_depth).all()
    for s in range(slots):
        par, dep, val = tree.parents[s], tree.depths[s], tree.valid[s]
        for i in range(1, n):
            p = par[i].item()
            if val[i]:
                assert val[p], "prefix closure: a valid node's parent is valid"
                assert dep[i] == dep[p] + 1, "depth = parent's depth + 1"
                expect = tree.scores[s, p] + lp[s, dep[i] - 1, tree.tokens[s, i]]
                assert torch.allclose(tree.scores[s, i], expect, atol=1e-5), "score = parent's + log-prob"
            else:
                assert p == 0 and dep[i] == 1, "invalid nodes hang off the root"
        # Siblings (valid ones) carry distinct tokens.
        seen = set()
        for i in range(1, n):
            if val[i]:
                key = (par[i].item(), tree.tokens[s, i].item())
                assert key not in seen, f"duplicate sibling {key}"
                seen.add(key)


# --- build_tree vs brute force ---------------------------------------------------------------------------
CASES = [  # (slots, depth, vocab, budgets)
    (1, 1, 5, [1, 3, 5, 9]),
    (2, 2, 3, [1, 2, 4, 11, 12, 20]),  # 12 prefixes in all
    (3, 3, 4, [1, 5, 16, 40, 84, 100]),  # 84 prefixes in all
    (2, 4, 3, [7, 30, 120, 200]),  # 120 prefixes in all
    (2, 3, 7, [1, 2, 6, 25, 64]),
    (1, 5, 2, [3, 17, 62, 80]),  # 62 prefixes in all
]


@pytest.mark.parametrize("slots,depth,vocab,budgets", CASES)
@pytest.mark.parametrize("spread", [0.5, 3.0])
def test_build_tree_is_brute_force_top_budget(slots, depth, vocab, budgets, spread):
    lp = random_logprobs(slots, depth, vocab, seed=slots * 100 + depth * 10 + vocab, spread=spread)
    bonus = torch.arange(slots) + 1
    for budget in budgets:
        tree = build_tree(bonus, lp, budget=budget)
        assert tree.size == 1 + budget and tree.max_depth == depth
        check_structure(tree, lp, bonus)
        for s in range(slots):
            brute = brute_force_prefixes(lp[s])
            paths = node_paths(tree, s)
            want = min(budget, len(brute))
            assert len(paths) == want, f"budget {budget}: {len(paths)} valid nodes, expected {want}"
            assert int(tree.valid[s].sum()) - 1 == want
            chosen = set(paths.values())
            if want < len(brute) and brute[want - 1][0] == brute[want][0]:
                # A tie at the boundary: any top set will do; check optimality instead of identity.
                worst_in = min(sc for sc, _, p in brute if p in chosen)
                best_out = max(sc for sc, _, p in brute if p not in chosen)
                assert worst_in >= best_out
            else:
                assert chosen == {p for _, _, p in brute[:want]}


def test_build_tree_zero_probability_tokens_are_never_valid():
    lp = random_logprobs(2, 3, 5, seed=7)
    lp[:, :, 3:] = -float("inf")  # only tokens 0..2 possible: 3 + 9 + 27 = 39 prefixes
    lp[1, 1, :] = torch.tensor([0.0, -float("inf"), -float("inf"), -float("inf"), -float("inf")])
    bonus = torch.tensor([9, 9])
    tree = build_tree(bonus, lp, budget=60)
    check_structure(tree, lp, bonus)
    for s, total in ((0, 39), (1, 3 + 3 + 9)):
        brute = brute_force_prefixes(lp[s])
        assert len(brute) == total
        paths = node_paths(tree, s)
        assert set(paths.values()) == {p for _, _, p in brute}
        assert all(t < 3 for p in paths.values() for t in p)


def test_build_tree_budget_larger_than_prefixes_invalid_nodes_never_accepted():
    lp = random_logprobs(3, 2, 3, seed=3)
    bonus = torch.tensor([4, 5, 6])
    tree = build_tree(bonus, lp, budget=20)  # 12 prefixes: 8 invalid nodes per slot
    invalid = ~tree.valid
    assert (invalid.sum(1) == 8).all()
    # Make the derived token at every invalid node's parent (the root) equal to its token: still refused.
    for s in range(3):
        for i in torch.nonzero(invalid[s]).flatten().tolist():
            derived = torch.zeros(3, tree.size, dtype=torch.long)
            derived[s, tree.parents[s, i]] = tree.tokens[s, i]
            w = walk(tree, derived)
            on_path = w.path[s, :w.accepted[s]]
            assert tree.valid[s, on_path].all()


@pytest.mark.parametrize("depth,vocab", [(1, 4), (3, 6), (7, 11), (15, 3)])
def test_branching_one_is_the_argmax_chain(depth, vocab):
    lp = random_logprobs(4, depth, vocab, seed=depth)
    bonus = torch.tensor([1, 2, 3, 0])
    tree = build_tree(bonus, lp, budget=depth, branching=1)
    check_structure(tree, lp, bonus)
    assert tree.valid.all()
    assert torch.equal(tree.tokens[:, 1:], lp.argmax(-1))
    assert torch.equal(tree.parents[:, 1:], torch.arange(depth).expand(4, depth))
    assert torch.equal(tree.depths, torch.arange(depth + 1).expand(4, depth + 1))


@pytest.mark.parametrize("depth,vocab", [(1, 4), (3, 6), (7, 11), (15, 3)])
def test_chain_is_build_trees_branching_one_tree(depth, vocab):
    from treeflash.tree import build_chain

    lp = random_logprobs(4, depth, vocab, seed=depth)
    bonus = torch.tensor([1, 2, 3, 0])
    chain, tree = build_chain(bonus, lp), build_tree(bonus, lp, budget=depth, branching=1)
    for field in ("tokens", "parents", "depths", "valid"):
        assert torch.equal(getattr(chain, field), getattr(tree, field)), field
    torch.testing.assert_close(chain.scores, tree.scores)  # a running sum vs one add per depth
    assert chain.max_depth == depth and chain.ranked_scores is None


@pytest.mark.parametrize("branching,budget", [(2, 5), (2, 14), (3, 20)])
def test_branching_limits_children_to_top_tokens(branching, budget):
    lp = random_logprobs(2, 3, 6, seed=branching * budget)
    bonus = torch.tensor([0, 1])
    tree = build_tree(bonus, lp, budget=budget, branching=branching)
    check_structure(tree, lp, bonus)
    for s in range(2):
        brute = brute_force_prefixes(lp[s], branching=branching)
        want = min(budget, len(brute))
        assert set(node_paths(tree, s).values()) == {p for _, _, p in brute[:want]}


def test_build_tree_slots_are_independent():
    lp = random_logprobs(5, 3, 6, seed=11)
    bonus = torch.arange(5)
    batched = build_tree(bonus, lp, budget=10)
    for s in range(5):
        alone = build_tree(bonus[s:s + 1], lp[s:s + 1], budget=10)
        for field in ("tokens", "parents", "depths", "valid"):
            assert torch.equal(getattr(batched, field)[s:s + 1], getattr(alone, field))


# --- ancestor_mask ---------------------------------------------------------------------------------------
def brute_ancestors(parents: list[int]) -> torch.Tensor:
    n = len(parents)
    m = torch.zeros(n, n, dtype=torch.bool)
    for i in range(n):
        j = i
        while True:
            m[i, j] = True
            if j == 0:
                break
            j = parents[j]
    return m


def test_ancestor_mask_of_built_trees():
    lp = random_logprobs(3, 4, 5, seed=5)
    for budget in (1, 6, 30):
        tree = build_tree(torch.zeros(3, dtype=torch.long), lp, budget=budget)
        mask = ancestor_mask(tree)
        for s in range(3):
            assert torch.equal(mask[s], brute_ancestors(tree.parents[s].tolist()))


def test_ancestor_mask_hand_made_and_root_only():
    tree = hand_tree()
    expected = brute_ancestors([0, 0, 0, 1, 1, 2, 3])
    assert expected[6].tolist() == [True, True, False, True, False, False, True]
    assert torch.equal(ancestor_mask(tree)[0], expected)
    ro = root_only(torch.tensor([3, 4]))
    assert ancestor_mask(ro).shape == (2, 1, 1) and ancestor_mask(ro).all()


# --- walk ------------------------------------------------------------------------------------------------
def hand_tree(slots: int = 1) -> DraftTree:
    """root(9) -> n1(3) -> n3(5) -> n6(8); n1 -> n4(6); root -> n2(4) -> n5(7)."""
    tokens = torch.tensor([9, 3, 4, 5, 6, 7, 8])
    parents = torch.tensor([0, 0, 0, 1, 1, 2, 3])
    depths = torch.tensor([0, 1, 1, 2, 2, 2, 3])
    n = tokens.shape[0]
    return DraftTree(tokens.expand(slots, n).clone(), parents.expand(slots, n).clone(), depths.expand(slots, n).clone(),
                     torch.ones(slots, n, dtype=torch.bool), torch.zeros(slots, n), max_depth=3)


@pytest.mark.parametrize("derived,path,emitted", [
    # root derives 3 -> n1; n1 derives 5 -> n3; n3 derives 8 -> n6; n6 derives 2: the whole deepest path.
    ([3, 5, 0, 8, 0, 0, 2], [0, 1, 3, 6], [3, 5, 8, 2]),
    # root derives 3 -> n1; n1 derives 6 -> n4 (a second child); n4 derives 1 (a leaf: the bonus).
    ([3, 6, 0, 0, 1, 0, 0], [0, 1, 4], [3, 6, 1]),
    # root derives 4 -> n2 (second child of the root); n2 derives 7 -> n5; n5 derives 0.
    ([4, 5, 7, 8, 8, 0, 0], [0, 2, 5], [4, 7, 0]),
    # root derives 2: no child matches; the bonus is 2.
    ([2, 5, 7, 8, 8, 0, 0], [0], [2]),
    # root derives 3 -> n1; n1 derives 7 (that is n5's token, but n5 is not n1's child): stop.
    ([3, 7, 0, 0, 0, 0, 0], [0, 1], [3, 7]),
])
def test_walk_hand_made(derived, path, emitted):
    tree = hand_tree()
    w = walk(tree, torch.tensor([derived]))
    a = int(w.accepted[0])
    assert a == len(path)
    assert w.path[0, :a].tolist() == path
    assert w.emitted[0, :a].tolist() == emitted
    assert w.path.shape == (1, tree.max_depth + 1) and w.emitted.shape == (1, tree.max_depth + 1)


def test_walk_batch_and_invalid_nodes():
    tree = hand_tree(3)
    valid = tree.valid.clone()
    valid[2, 1] = False  # slot 2: n1 is invalid (so is its subtree, by closure: mark them too)
    valid[2, 3] = valid[2, 4] = valid[2, 6] = False
    tree = DraftTree(tree.tokens, tree.parents, tree.depths, valid, tree.scores, tree.max_depth)
    derived = torch.tensor([[3, 5, 0, 8, 0, 0, 1],
                            [4, 0, 1, 0, 0, 0, 0],
                            [3, 5, 0, 8, 0, 0, 1]])
    w = walk(tree, derived)
    assert w.accepted.tolist() == [4, 2, 1]
    assert w.emitted[0].tolist() == [3, 5, 8, 1]
    assert w.emitted[1, :2].tolist() == [4, 1]
    assert w.emitted[2, :1].tolist() == [3]


def test_walk_root_only_is_autoregressive():
    tree = root_only(torch.tensor([5, 6]))
    w = walk(tree, torch.tensor([[2], [3]]))
    assert w.accepted.tolist() == [1, 1]
    assert w.emitted.tolist() == [[2], [3]]
    assert w.path.tolist() == [[0], [0]]


def test_a_budget_below_the_block_needs_only_its_own_depths():
    """A tree of B nodes never goes deeper than B, so drafting only depths 1..B (what the Speculator
    asks the drafter for at a fixed budget below the block's depth) builds the very same tree."""
    torch.manual_seed(0)
    for budget in (1, 2, 4, 7):
        logprobs = torch.log_softmax(torch.randn(3, 15, 40) * 3, dim=-1)
        bonus = torch.tensor([1, 2, 3])
        full, cut = build_tree(bonus, logprobs, budget), build_tree(bonus, logprobs[:, :budget], budget)
        for name in ("tokens", "parents", "depths", "valid", "scores"):
            assert torch.equal(getattr(full, name), getattr(cut, name)), (budget, name)
        assert int(full.depths.max()) <= budget



@pytest.mark.parametrize("budget", [1, 3, 8, 24, 64])
@pytest.mark.parametrize("levels", [3, None])  # 3: few distinct log-probs, ties everywhere
def test_pruned_beam_ranking_equals_the_full_one(monkeypatch, budget, levels):
    from treeflash import tree as tree_module

    gen = torch.Generator().manual_seed(budget)
    lp = torch.randn(3, 5, 40, generator=gen)
    if levels:
        lp = (lp * levels).round() / levels
    lp = lp.log_softmax(-1)
    bonus = torch.zeros(3, dtype=torch.long)
    pruned = build_tree(bonus, lp, budget=budget)
    k = min(budget, 40)
    pairs, beam_of, child_of = tree_module._beam_pairs(budget, k, torch.device("cpu"))
    assert torch.equal(pairs, beam_of * k + child_of)
    assert all((i + 1) * (j + 1) <= budget for i, j in zip(beam_of.tolist(), child_of.tolist()))

    def every_pair(budget, k, device):  # the ranking before pruning: all budget x K pairs, i-major
        i, j = torch.meshgrid(torch.arange(budget), torch.arange(k), indexing="ij")
        return torch.arange(budget * k), i.flatten(), j.flatten()

    monkeypatch.setattr(tree_module, "_beam_pairs", every_pair)
    full = build_tree(bonus, lp, budget=budget)
    for field in ("tokens", "parents", "depths", "valid", "scores", "ranked_scores"):
        assert torch.equal(getattr(pruned, field), getattr(full, field)), field


def test_tree_kernel_default_is_trees_to_budget_256_on_cuda_only():
    from treeflash.round import use_tree_kernel

    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    # 15 depths (block size 16): 15 x 256 = 3840 -> 4096 candidates sorted, measured faster; 15 x 512 was not.
    assert all(use_tree_kernel(None, cuda, 15, b) for b in (1, 4, 16, 64, 128, 256))
    assert use_tree_kernel(None, cuda, 15, 273) and not use_tree_kernel(None, cuda, 15, 274)  # 4095 vs 4110
    assert not any(use_tree_kernel(None, cuda, 15, b) for b in (512, 1024))
    assert use_tree_kernel(None, cuda, 4, 1024) and not use_tree_kernel(None, cuda, 5, 1024)  # 4096 vs 5120
    assert use_tree_kernel(True, cuda, 15, 512) and not use_tree_kernel(False, cuda, 15, 16)
    assert not any(use_tree_kernel(s, cpu, 15, 16) for s in (None, True, False))  # Triton: CUDA only
