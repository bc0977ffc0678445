"""Prompt lookup (treeflash/lookup.py): the copied continuation, its graft onto a round's tree, and the
engine with it: the same greedy tokens as plain decoding for every method, more tokens per round where
the output repeats itself. (Sampling with it: test_speculative.py's joint test.)"""

from __future__ import annotations

import pytest
import torch

from treeflash import LLM, SamplingParams
from treeflash.budget import NO_DRAFT
from treeflash.lookup import compact, graft, lookup
from treeflash.round import SpecConfig
from treeflash.tree import build_tree, root_only, walk
from spec_helpers import make_drafter, make_target


def one(history: list[int], bonus: int, tokens: int, pad: int = 4) -> tuple[list[int], list[bool]]:
    h = torch.tensor([history + [99] * pad])  # rows past the length hold stale tokens: never read, never copied
    chain, ok = lookup(h, torch.tensor([len(history)]), torch.tensor([bonus]), tokens)
    return chain[0].tolist(), ok[0].tolist()


def test_lookup_copies_what_followed_the_latest_earlier_occurrence_of_the_longest_suffix():
    # Sequence 5 6 7 8 5 6 | 7: the 3-token suffix 5 6 7 occurred at 0; what followed runs into the root
    # (past the end the token is 0, not the stale rows', so a round's tree depends on its sequence alone).
    assert one([5, 6, 7, 8, 5, 6], 7, 6) == ([8, 5, 6, 7, 0, 0], [True] * 4 + [False] * 2)
    # The longest suffix first: 2 3 4 occurred at 0 (then 9); the 1-token suffix 4 occurred later (then 5).
    chain, ok = one([2, 3, 4, 9, 4, 5, 2, 3], 4, 2)
    assert chain == [9, 4] and ok == [True, True]
    # The latest of several occurrences: 1 2 then 7 at 0, then 8 at 3.
    assert one([1, 2, 7, 1, 2, 8, 6, 1], 2, 1) == ([8], [True])
    # Nothing occurred before (stale rows past the length never match): nothing to copy.
    assert one([1, 2, 3], 4, 3) == ([0] * 3, [False] * 3)
    assert one([], 4, 2)[1] == [False, False]  # the root alone
    # A loop: the suffix 3 3 3 occurred one token earlier, and its continuation is the root.
    assert one([3, 3, 3], 3, 3) == ([3, 0, 0], [True, False, False])


def test_lookup_runs_every_slot_at_its_own_length():
    history = torch.tensor([[1, 2, 1, 0, 0], [4, 5, 6, 4, 5]])
    chain, ok = lookup(history, torch.tensor([3, 5]), torch.tensor([2, 6]), 2)
    # slot 0: 1 2 1 | 2 -> "1 2" at 0, then 1 2; slot 1: 4 5 6 4 5 | 6 -> "5 6" ... "4 5 6" at 0, then 4 5.
    assert chain.tolist() == [[1, 2], [4, 5]] and ok.tolist() == [[True, True], [True, True]]


def valid_siblings_distinct(tree) -> bool:
    for s in range(tree.tokens.shape[0]):
        seen = set()
        for n in range(1, tree.size):
            if tree.valid[s, n]:
                key = (int(tree.parents[s, n]), int(tree.tokens[s, n]))
                if key in seen:
                    return False
                seen.add(key)
    return True


def test_graft_extends_the_tree_path_the_chain_already_spells_and_keeps_siblings_distinct():
    gen = torch.Generator().manual_seed(0)
    logprobs = torch.randn(3, 4, 6, generator=gen).log_softmax(-1)
    tree = build_tree(torch.tensor([0, 1, 2]), logprobs, budget=10)
    # Each slot's chain starts along its tree's first path (node 1, then its best child, ...).
    def best_child(s, n):
        return next((c for c in range(1, tree.size) if tree.parents[s, c] == n and tree.valid[s, c]), None)

    chains = []
    for s in range(3):
        path, node = [], 0
        while (node := best_child(s, node)) is not None and len(path) < 2:
            path.append(int(tree.tokens[s, node]))
        chains.append(path + [5, 4, 3][:4 - len(path)])
    chain = torch.tensor(chains)
    ok = torch.ones_like(chain, dtype=torch.bool)
    ok[2, 3] = False  # slot 2's continuation ends early
    merged = graft(tree, chain, ok)
    assert merged.size == tree.size + 4 and merged.max_depth == 4
    assert valid_siblings_distinct(merged)
    assert torch.equal(merged.tokens[:, :tree.size], tree.tokens)  # the tree itself is unchanged
    for s in range(3):
        # Walking the chain's tokens accepts the whole chain (as far as it is valid): target = the chain.
        derived = torch.zeros(1, merged.size, dtype=torch.long)
        node_path = [0]
        for depth, token in enumerate(chains[s][:4 if s != 2 else 3]):
            kids = [c for c in range(merged.size) if merged.valid[s, c] and c and merged.parents[s, c] == node_path[-1]
                    and merged.tokens[s, c] == token]
            assert len(kids) == 1, (s, depth)
            derived[0, node_path[-1]] = token
            node_path.append(kids[0])
        one_slot = type(merged)(*(t[s:s + 1] for t in (merged.tokens, merged.parents, merged.depths, merged.valid,
                                                         merged.scores)), max_depth=merged.max_depth)
        assert walk(one_slot, derived).accepted.item() == len(node_path)


def test_graft_onto_a_root_alone_is_a_chain_from_the_root():
    merged = graft(root_only(torch.tensor([7])), torch.tensor([[1, 2, 3]]), torch.tensor([[True, True, False]]))
    assert merged.tokens.tolist() == [[7, 1, 2, 3]] and merged.parents.tolist() == [[0, 0, 1, 2]]
    assert merged.depths.tolist() == [[0, 1, 2, 3]] and merged.valid.tolist() == [[True, True, True, False]]


def path_of(tree, s: int, n: int) -> tuple[int, ...]:
    """The tokens from below the root down to node n of slot s."""
    tokens = []
    while n:
        tokens.append(int(tree.tokens[s, n]))
        n = int(tree.parents[s, n])
    return tuple(reversed(tokens))


def test_compact_keeps_the_tree_node_for_node_in_fewer_rows():
    # Random trees and histories (a small vocabulary, so chains often overlap tree paths and often match
    # nothing): the compacted tree spells the same valid paths at the same depths, walks to the same tokens
    # for any target, and ends at the most valid lookup rows any slot has.
    gen = torch.Generator().manual_seed(5)
    vocab, shrunk = 4, 0
    for trial in range(150):
        slots = 3
        budget, tokens = (int(torch.randint(low, high, (1,), generator=gen)) for low, high in ((0, 9), (1, 7)))
        bonus = torch.randint(0, vocab, (slots,), generator=gen)
        tree = root_only(bonus) if budget == 0 else \
            build_tree(bonus, torch.randn(slots, 4, vocab, generator=gen).log_softmax(-1), budget=budget)
        history = torch.randint(0, vocab, (slots, 12), generator=gen)
        seq_lens = torch.randint(0, 13, (slots,), generator=gen)
        merged = graft(tree, *lookup(history, seq_lens, bonus, tokens))
        small = compact(merged, tree.size)
        kept = merged.valid[:, tree.size:].sum(1)
        assert small.size == tree.size + int(kept.max()) and torch.equal(small.valid[:, tree.size:].sum(1), kept)
        shrunk += small.size < merged.size
        for s in range(slots):
            paths = {n: path_of(merged, s, n) for n in range(merged.size) if merged.valid[s, n]}
            again = {n: path_of(small, s, n) for n in range(small.size) if small.valid[s, n]}
            assert sorted(paths.values()) == sorted(again.values())
            assert all(small.depths[s, n] == len(p) and small.parents[s, n] < n for n, p in again.items() if n)
        truth = torch.randint(0, vocab, (slots, 12), generator=gen)
        if trial % 2:  # targets that follow the copied chain as far as it goes
            chain, ok = lookup(history, seq_lens, bonus, tokens)
            truth[:, :tokens] = torch.where(ok, chain, truth[:, :tokens])

        def target(t):
            on = [[path_of(t, s, n) == tuple(truth[s, :int(t.depths[s, n])].tolist()) for n in range(t.size)]
                  for s in range(slots)]
            follow = truth.gather(1, t.depths.clamp_max(11))
            return torch.where(torch.tensor(on), follow, (t.tokens * 3 + 1) % vocab)

        a, b = walk(merged, target(merged)), walk(small, target(small))
        assert torch.equal(a.accepted, b.accepted)
        for s in range(slots):
            depth = int(a.accepted[s])
            assert merged.tokens[s, a.path[s, :depth]].tolist() == small.tokens[s, b.path[s, :depth]].tolist()
            assert a.emitted[s, :depth].tolist() == b.emitted[s, :depth].tolist()
    assert shrunk > 50  # (and some trials keep every row: compact returns the tree as it was)


def test_compact_drops_the_lookup_rows_of_slots_not_kept():
    gen = torch.Generator().manual_seed(7)
    keep = torch.tensor([True, False, True])
    for _ in range(40):
        bonus = torch.randint(0, 4, (3,), generator=gen)
        tree = build_tree(bonus, torch.randn(3, 4, 4, generator=gen).log_softmax(-1), budget=5)
        history = torch.randint(0, 4, (3, 12), generator=gen)
        merged = graft(tree, *lookup(history, torch.randint(0, 13, (3,), generator=gen), bonus, 6))
        every, some = compact(merged, tree.size), compact(merged, tree.size, keep)
        assert not some.valid[1, tree.size:].any()
        assert torch.equal(some.tokens[:, :tree.size], tree.tokens) and torch.equal(some.valid[:, :tree.size], tree.valid)
        for s in (0, 2):
            assert sorted(path_of(some, s, n) for n in range(some.size) if some.valid[s, n]) == \
                sorted(path_of(every, s, n) for n in range(every.size) if every.valid[s, n])


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    root = tmp_path_factory.mktemp("lookup")
    target = make_target(root / "target", vocab=64)
    return target, make_drafter(root / "drafter", target, 4)


REPEATING = [[3, 4, 5, 6] * 6, [9, 8, 7, 9, 8, 7, 9, 8], [2, 3, 5, 7, 11, 13, 17, 19, 23, 29]]


@pytest.mark.parametrize("spec,budget", [("none", "auto"), ("dflash", "auto"), ("ddtree", 8), ("ddtree", "auto")])
def test_greedy_with_prompt_lookup_is_plain_decoding_and_accepts_more_where_text_repeats(pair, spec, budget):
    params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    plain = LLM(str(pair[0]), device="cpu").generate(prompt_token_ids=REPEATING, sampling_params=params)
    kw = dict(device="cpu", spec=spec, draft_model=None if spec == "none" else str(pair[1]), max_num_seqs=2)
    if budget != "auto":
        kw["tree_budget"] = budget
    outs = LLM(str(pair[0]), ngram_tokens=6, **kw).generate(prompt_token_ids=REPEATING, sampling_params=params)
    assert [o.token_ids for o in outs] == [o.token_ids for o in plain]
    for o in outs:
        assert 1 + sum(o.metrics.acceptance_lengths) == len(o.token_ids)
    if spec == "none":  # a random tiny model at greedy loops: copies of its own output get accepted
        assert max(o.metrics.mean_acceptance_length for o in outs) > 1.5


def test_on_the_cpu_lookup_drafts_for_greedy_requests_only(pair):
    """Eager rounds drop a sampled slot's lookup rows: its seeded tokens are those of the same run without
    lookup, round for round, while a greedy request beside it still gets lookup's tokens."""
    sampled = [SamplingParams(temperature=1.0, max_tokens=30, seed=s, ignore_eos=True) for s in (1, 2)]
    greedy = SamplingParams(temperature=0, max_tokens=30, ignore_eos=True)
    kw = dict(device="cpu", draft_model=str(pair[1]), tree_budget=8, max_num_seqs=3)
    runs = [LLM(str(pair[0]), ngram_tokens=n, **kw).generate(prompt_token_ids=REPEATING,
                                                                sampling_params=[greedy, *sampled])
            for n in (0, 6)]
    for without, with_ in zip(runs[0][1:], runs[1][1:]):
        assert with_.token_ids == without.token_ids
        assert with_.metrics.acceptance_lengths == without.metrics.acceptance_lengths
    assert runs[1][0].token_ids == runs[0][0].token_ids  # (greedy: plain decoding's either way)
    assert runs[1][0].metrics.mean_acceptance_length > runs[0][0].metrics.mean_acceptance_length


def test_a_round_without_a_draft_grafts_no_lookup(pair):
    """The automatic budget's NO_DRAFT round is plain decoding's step, as the chooser weighs it: lookup's
    rows there cost 2.6x the AR step at 8 slots on a 2-core CPU, where the chooser counted one token."""
    params = SamplingParams(temperature=0, max_tokens=30, ignore_eos=True)
    plain = LLM(str(pair[0]), device="cpu").generate(prompt_token_ids=REPEATING, sampling_params=params)
    llm = LLM(str(pair[0]), device="cpu", draft_model=str(pair[1]), ngram_tokens=6, max_num_seqs=3)
    llm.engine.budget.choose = lambda bucket: NO_DRAFT
    outs = llm.generate(prompt_token_ids=REPEATING, sampling_params=params)
    assert [o.token_ids for o in outs] == [o.token_ids for o in plain]
    assert all(set(o.metrics.acceptance_lengths) == {1} for o in outs)
    assert all(set(o.metrics.round_budgets) == {NO_DRAFT} for o in outs)


def test_the_drawn_tree_names_lookups_nodes():
    from treeflash.tree_view import render_tree

    logprobs = torch.full((1, 3, 8), -9.0)
    logprobs[:, :, 0], logprobs[:, :, 1] = -0.1, -3.0  # a tree of 0s and 1s: the chain 5, 6 is all lookup's
    tree = build_tree(torch.tensor([1]), logprobs, budget=3)
    merged = graft(tree, torch.tensor([[5, 6]]), torch.tensor([[True, True]]))
    derived = torch.tensor([[5, 6, 6, 6, 6, 7]])[:, :merged.size]  # the target follows the copied chain
    drawn = render_tree(merged, walk(merged, derived), 0, str, drafted=tree.size)
    assert drawn.startswith("root 1  (3 draft nodes + 2 from prompt lookup, 2 accepted, bonus 7)")
    assert drawn.count("(lookup)") == 2 and "lookup = copied from earlier in the text" in drawn
    plain = render_tree(tree, walk(tree, derived[:, :tree.size]), 0, str)
    assert "(3 draft nodes," in plain and "lookup" not in plain


def test_prompt_lookup_settings_are_checked():
    with pytest.raises(ValueError, match=r"ngram_tokens must be an integer in \[0, 64\]"):
        SpecConfig("none", ngram_tokens=-1)
    with pytest.raises(ValueError, match="ngram_tokens"):
        SpecConfig("ddtree", ngram_tokens=65)
    with pytest.raises(ValueError, match="ngram_tokens"):
        SpecConfig("ddtree", ngram_tokens=True)
    with pytest.raises(ValueError, match="ngram_sampled must be True, False or None"):
        SpecConfig("ddtree", ngram_tokens=8, ngram_sampled="yes")


def test_prompt_lookup_is_on_by_default_with_a_drafter(pair, tmp_path, monkeypatch):
    from treeflash.engine import default_budget_profile
    from treeflash.lookup import DEFAULT_TOKENS, default_tokens

    assert default_tokens("ddtree") == default_tokens("dflash") == DEFAULT_TOKENS == 8
    assert default_tokens("none") == 0
    assert LLM(str(pair[0]), device="cpu", draft_model=str(pair[1])).spec.ngram_tokens == 8
    assert LLM(str(pair[0]), device="cpu").spec.ngram_tokens == 0  # (plain decoding stays plain)
    # An explicit setting wins; a cost profile measured with lookup is not one without.
    llm = LLM(str(pair[0]), device="cpu", draft_model=str(pair[1]), ngram_tokens=0)
    looked = LLM(str(pair[0]), device="cpu", draft_model=str(pair[1]), ngram_tokens=8)
    assert llm.spec.ngram_tokens == 0
    monkeypatch.setenv("TREEFLASH_CACHE", str(tmp_path))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H200")
    assert default_budget_profile(llm.engine) != default_budget_profile(looked.engine)


def reference_lookup(seq: list[int], tokens: int) -> list[int] | None:
    """The docstring's rule in plain Python: the continuation of the latest earlier occurrence of the
    sequence's last k tokens, for the largest k in [NGRAM_MIN, NGRAM_MAX] that has one."""
    from treeflash.lookup import NGRAM_MAX, NGRAM_MIN

    n = len(seq)
    for k in range(NGRAM_MAX, NGRAM_MIN - 1, -1):
        for j in range(n - k - 1, -1, -1):  # an occurrence at j..j+k-1 whose continuation j+k is inside
            if k < n and seq[j:j + k] == seq[n - k:]:
                return seq[j + k:j + k + tokens]
    return None


def test_lookup_agrees_with_a_plain_python_reference_on_random_sequences():
    gen = torch.Generator().manual_seed(3)
    for _ in range(400):
        slots, capacity = 3, int(torch.randint(1, 30, (1,), generator=gen))
        vocab = int(torch.randint(2, 5, (1,), generator=gen))
        history = torch.randint(0, vocab, (slots, capacity), generator=gen)
        seq_lens = torch.randint(0, capacity + 1, (slots,), generator=gen)
        bonus = torch.randint(0, vocab, (slots,), generator=gen)
        chain, ok = lookup(history, seq_lens, bonus, 5)
        for s in range(slots):
            want = reference_lookup(history[s, :seq_lens[s]].tolist() + [int(bonus[s])], 5)
            got = chain[s][ok[s]].tolist()
            assert got == (want or []) and ok[s].tolist() == sorted(ok[s].tolist(), reverse=True)
