"""The structure kernels (treeflash/structure_kernel.py) give `GrammarSlots`' torch ops' outputs element for
element, through Triton's interpreter on the CPU: node states and masks over random trees, the drafts'
chain masks (with and without a draft vocabulary, with depths none of whose allowed tokens it holds), and
the slots' states after emitted tokens."""

from __future__ import annotations

import random

import pytest
import torch

from triton_interpreter import mend  # noqa: F401  (first: it turns the interpreter on)
from treeflash import SamplingParams
from treeflash.structured import Grammar, GrammarSlots
from treeflash.tree import DraftTree
from spec_helpers import random_tree_shape
from test_bad_words import pair  # noqa: F401 (a char-level target with a tokenizer, and a drafter)
from test_penalties import _llm

pytestmark = pytest.mark.usefixtures("mend")


def _table(rng: random.Random, states: int, vocab: int, share: float) -> dict[int, dict[int, int]]:
    return {s: {t: rng.randrange(states) for t in rng.sample(range(vocab), max(1, int(share * vocab)))}
            for s in range(states)}


def _pair(slots: int, vocab: int, seed: int) -> tuple[GrammarSlots, GrammarSlots, random.Random]:
    """Two tables holding the same automata in the same slots (one structure-free slot), one per path."""
    rng = random.Random(seed)
    grammars = [Grammar.from_table(vocab, 0, _table(rng, rng.randint(2, 9), vocab, rng.choice([0.02, 0.3, 0.9])))
                for _ in range(slots - 1)] + [None]
    rng.shuffle(grammars)
    pair = GrammarSlots(slots, vocab, "cpu", kernels=True), GrammarSlots(slots, vocab, "cpu", kernels=False)
    for structure in pair:
        structure.start(list(range(slots)), grammars)
    return *pair, rng


def _tree(rng: random.Random, slots: int, n: int, vocab: int, depth: int, allowed: GrammarSlots) -> DraftTree:
    """Random trees whose tokens are mostly allowed along their paths (so states go deep), some not."""
    parents, depths = random_tree_shape(rng, slots, n, depth)
    tokens = torch.randint(0, vocab, (slots, n), generator=torch.Generator().manual_seed(rng.randrange(1 << 30)))
    state = allowed.state[:slots, None].expand(slots, n).clone()
    for i in range(1, n):  # follow each path, choosing an allowed token four times in five
        above = state.gather(1, parents[:, i:i + 1])[:, 0]
        rows = allowed.allowed_rows(above)
        for s in range(slots):
            ok = rows[s].nonzero().flatten().tolist()
            if ok and rng.random() < 0.8:
                tokens[s, i] = rng.choice(ok)
        state[:, i] = allowed.step(above, tokens[:, i])
    return DraftTree(tokens, parents, depths, torch.ones(slots, n, dtype=torch.bool), torch.zeros(slots, n),
                     int(depths.max()))


@pytest.mark.parametrize("seed", range(3))
def test_node_masks_equal_the_torch_ops(seed):
    slots, vocab = 4, 300
    kernel, ops, rng = _pair(slots, vocab, seed)
    for n, depth in ((1, 0), (9, 3), (40, 15)):
        tree = _tree(rng, slots, n, vocab, depth, ops)
        logits = torch.randn(slots, n, vocab).to(torch.bfloat16)
        for prefill in (False, True):
            for t in (tree, None):
                assert torch.equal(kernel.apply(logits, slice(0, slots), t, prefill and t is None),
                                   ops.apply(logits, slice(0, slots), t, prefill and t is None)), (n, prefill)
        rows = torch.tensor([2, 0])  # (a subset of the slots, in another order: the verify's rows)
        sub = _sub(tree, rows)
        assert torch.equal(kernel.apply(logits[:2], rows, sub), ops.apply(logits[:2], rows, sub))


def _sub(tree: DraftTree, rows: torch.Tensor) -> DraftTree:
    return DraftTree(tree.tokens[rows], tree.parents[rows], tree.depths[rows], tree.valid[rows], tree.scores[rows],
                     tree.max_depth)


@pytest.mark.parametrize("seed", range(3))
def test_draft_masks_equal_the_torch_ops(seed, monkeypatch):
    import treeflash.structure_kernel as sk

    monkeypatch.setattr(sk, "VOCAB_BLOCK", 64)  # several blocks of the vocabulary a depth
    slots, vocab, depths = 5, 300, 6
    kernel, ops, rng = _pair(slots, vocab, seed)
    logits = torch.randn(slots, depths, vocab)
    logits[0, 2] = float("-inf")  # a depth the drafter rules out entirely
    logits[1, :, ::7] = 5.0  # ties: the first one is the chain's
    assert torch.equal(kernel.apply_drafts(logits, slice(0, slots)), ops.apply_drafts(logits, slice(0, slots)))
    # Draft vocabularies: a random one, and one holding none of some slot's allowed tokens (that slot's
    # first depth then keeps the drafter's logits).
    slot = next(s for s in range(slots) if kernel.grammars[s] is not None)
    banned = (ops.allowed_rows(ops.state[slot]) == 0).nonzero().flatten().tolist()
    for columns in (sorted(rng.sample(range(vocab), 70)), banned[:70]):
        columns = torch.tensor(columns)
        draft = logits[:, :, :len(columns)].clone()
        got, want = (s.apply_drafts(draft, slice(0, slots), columns) for s in (kernel, ops))
        assert torch.equal(got, want)
        assert (~torch.isfinite(want) & torch.isfinite(draft)).any()  # (masks made)
    assert torch.equal(want[slot, 0], draft[slot, 0])


@pytest.mark.parametrize("seed", range(3))
def test_followed_states_equal_the_torch_ops(seed):
    slots, vocab = 6, 120
    kernel, ops, rng = _pair(slots, vocab, seed)
    for _ in range(8):
        k = rng.randint(1, 17)
        emitted = torch.zeros(slots, k, dtype=torch.long)
        accepted = torch.tensor([rng.randint(0, k) for _ in range(slots)])
        for s in range(slots):  # mostly allowed tokens, now and then one that is not (state 0 after it)
            state = int(ops.state[s])
            for j in range(k):
                row = ops.allowed_rows(torch.tensor(state)).nonzero().flatten().tolist()
                emitted[s, j] = rng.choice(row) if row and rng.random() < 0.95 else rng.randrange(vocab)
                state = int(ops.step(torch.tensor(state), emitted[s, j]))
        n = rng.randint(1, slots)  # rounds of the first n slots
        kernel.add(emitted[:n], accepted[:n])
        ops.add(emitted[:n], accepted[:n])
        assert torch.equal(kernel.state, ops.state)
    assert (ops.state > 0).any()


@pytest.mark.parametrize("spec", ["dflash", "ddtree"])
def test_rounds_through_the_kernels_give_plain_decodings_tokens(pair, spec, monkeypatch):
    params = [SamplingParams(temperature=0, max_tokens=12, structured_outputs={"regex": r"(ab|cd)+ [a-z]{2,9}7"}),
              SamplingParams(temperature=0.9, max_tokens=12, seed=2, structured_outputs={"regex": "[a-e ]{3,20}"}),
              SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)]
    prompts = ["the cat", "a b c", "zz top"]
    plain = [o.token_ids for o in _llm(pair, "none").generate(prompts, params)]
    init = GrammarSlots.__init__
    monkeypatch.setattr(GrammarSlots, "__init__", lambda self, *a, **k: init(self, *a, **{**k, "kernels": True}))
    llm = _llm(pair, spec)
    assert [o.token_ids for o in llm.generate(prompts, params)] == plain
    assert llm.engine.speculator.structure.kernels
