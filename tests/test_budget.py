"""tree_budget="auto": the rule that picks a budget, its calibration, the cost profile, and the
engine running with it (greedy output identical to plain decoding)."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from treeflash import LLM, SamplingParams
from treeflash.budget import (AUTO_BUDGETS, EXPLORE_BACKOFF, EXPLORE_EVERY, NO_DRAFT, NO_DRAFT_AFTER,
                              NO_DRAFT_AFTER_ROUNDS, BudgetChooser, CostProfile, best_budget, expected_drafts)
from treeflash.checkpoint import load_drafter, load_target
from treeflash.round import SpecConfig, Speculator
from treeflash.tree import build_tree
from spec_helpers import make_drafter, make_target


def flat_then_linear(knee: float, slope: float):
    """Round cost: flat (memory-bound) up to `knee` rows, then linear (compute-bound)."""
    return lambda b: 1.0 + slope * max(0.0, b - knee)


def saturating(limit: float, scale: float):
    """Accepted drafts that grow with the budget and saturate at `limit`."""
    return lambda b: limit * (1 - math.exp(-b / scale))


@pytest.mark.parametrize("cost,drafts,expected", [
    # Free nodes and acceptance that keeps growing: the largest budget.
    (flat_then_linear(1e9, 0.0), saturating(6.0, 200.0), 512),
    # Cost grows fast past 64 rows, acceptance is nearly saturated there: 64.
    (flat_then_linear(64, 0.02), saturating(4.0, 20.0), 64),
    # A drafter that is never right: the cheapest budget.
    (flat_then_linear(16, 0.001), lambda b: 0.0, 4),
    # Everything costs the same and gains nothing past 32: the smallest of the ties.
    (lambda b: 1.0, lambda b: min(b, 32) / 32, 32),
])
def test_best_budget_on_synthetic_curves(cost, drafts, expected):
    assert best_budget({b: cost(b) for b in AUTO_BUDGETS}, {b: drafts(b) for b in AUTO_BUDGETS}) == expected


def test_best_budget_is_the_argmax_of_tokens_per_second():
    torch.manual_seed(0)
    for _ in range(50):
        costs = dict(zip(AUTO_BUDGETS, torch.rand(len(AUTO_BUDGETS)).add(0.1).cumsum(0).tolist()))
        drafts = dict(zip(AUTO_BUDGETS, torch.rand(len(AUTO_BUDGETS)).mul(3).cumsum(0).tolist()))
        rate = {b: (1 + drafts[b]) / costs[b] for b in AUTO_BUDGETS}
        assert rate[best_budget(costs, drafts)] == max(rate.values())


def chooser_with(cost, **kwargs) -> BudgetChooser:
    return BudgetChooser(measure=lambda bucket, b: cost(b) * bucket, log=None, **kwargs)


def test_chooser_starts_at_the_initial_budget_then_follows_the_rule():
    chooser = chooser_with(flat_then_linear(64, 0.02))
    assert chooser.choose(1) == 64
    curve = [saturating(4.0, 20.0)(b) for b in AUTO_BUDGETS]
    column = AUTO_BUDGETS.index(64)
    for _ in range(20):  # the drafts come true as predicted: calibration 1
        chooser.observe(64, [1 + round(curve[column])] * 3, [curve] * 3)
    assert chooser.calibration == pytest.approx(round(curve[column]) / curve[column])
    assert chooser.choose(1) == 64


def test_calibration_shrinks_the_budget_of_an_overconfident_drafter():
    cost = flat_then_linear(16, 0.01)
    confident = [saturating(8.0, 100.0)(b) for b in AUTO_BUDGETS]
    trusted, doubted = chooser_with(cost), chooser_with(cost)
    column = AUTO_BUDGETS.index(64)
    for _ in range(30):
        trusted.observe(64, [1 + round(confident[column])], [confident])
        doubted.observe(64, [1], [confident])  # nothing it predicted was accepted
    assert doubted.calibration == pytest.approx(0.0)
    # The cheapest tree (4, 8 and 16 cost alike here: the smallest); it costs what a round without a
    # draft costs, so not drafting would gain nothing (NO_DRAFT needs a margin).
    assert doubted.choose(1) == AUTO_BUDGETS[0]
    assert trusted.choose(1) > 16


def test_a_bucket_is_measured_once_and_a_profile_interpolates(tmp_path):
    calls = []

    def measure(bucket, budget):
        calls.append((bucket, budget))
        return 0.01 * bucket + 1e-4 * budget + (0.005 if budget else 0.0)  # a tree pays for its draft too

    chooser = BudgetChooser(measure, probes=(16, 64, 256), log=None)
    costs = chooser.costs(4)
    chooser.costs(4)
    assert calls == [(4, NO_DRAFT), (4, 16), (4, 64), (4, 256)]
    assert costs[32] == pytest.approx(0.045 + 32e-4)  # between probes
    assert costs[512] == pytest.approx(0.045 + 512e-4)  # past the last, linearly
    chooser.profile.save(tmp_path / "p.json")
    again = CostProfile.load(tmp_path / "p.json")
    assert again.seconds == chooser.profile.seconds
    assert BudgetChooser(None, again, log=None).costs(4) == costs
    # Trees are interpolated among trees only: budget 4 lies past the first two measured trees.
    assert costs[4] == pytest.approx(0.045 + 4e-4) and costs[NO_DRAFT] == pytest.approx(0.04)
    with pytest.raises(ValueError, match="no cost profile"):
        BudgetChooser(None, again, log=None).costs(8)


def test_expected_drafts_sum_the_probabilities_of_the_best_prefixes():
    torch.manual_seed(0)
    logprobs = torch.randn(2, 3, 5).mul(2).log_softmax(-1)
    tree = build_tree(torch.tensor([1, 2]), logprobs, budget=4)
    m = expected_drafts(tree, torch.tensor([1, 4, 12, 100]))
    # The first 4 ranked candidates are the tree's nodes: m(4) is the sum of their probabilities.
    assert torch.allclose(m[:, 1], tree.scores[:, 1:].exp().sum(1))
    assert torch.all(m[:, 0] <= m[:, 1]) and torch.all(m[:, 1] <= m[:, 2])
    assert torch.equal(m[:, 2], m[:, 3])  # 3 depths x 4 beams = 12 candidates: nothing past them
    # m(1): the most probable first token.
    assert torch.allclose(m[:, 0], logprobs[:, 0].exp().amax(-1))


def test_auto_budget_engine_is_greedy_identical(tmp_path):
    target = make_target(tmp_path / "target", vocab=64)
    drafter = make_drafter(tmp_path / "drafter", target, 8)
    prompts = [[3, 5, 7, 11], [2, 4, 6], [9, 8, 7, 6, 5]]
    greedy = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)
    plain = LLM(str(target), device="cpu", max_num_seqs=3).generate(prompt_token_ids=prompts, sampling_params=greedy)
    profile = tmp_path / "profile.json"
    llm = LLM(str(target), device="cpu", draft_model=str(drafter), max_num_seqs=3, budget_profile=str(profile))
    assert llm.spec.tree_budget == "auto"
    outs = llm.generate(prompt_token_ids=prompts, sampling_params=greedy)
    assert [o.token_ids for o in outs] == [o.token_ids for o in plain]
    chooser = llm.engine.budget
    assert chooser.curve is not None and profile.is_file()
    assert set(CostProfile.load(profile).seconds[3]) == {0, 4, 8, 16}  # no draft and the eager candidates, measured when three slots ran
    for o in outs:  # each round's budget is on the request's metrics (and in its summary)
        assert len(o.metrics.round_budgets) == o.metrics.rounds and set(o.metrics.round_budgets) <= {0, 4, 8, 16}
        assert "auto budgets: " in o.metrics.summary()
    assert plain[0].metrics.round_budgets == [] and "auto budgets" not in plain[0].metrics.summary()


def test_first_round_budget_is_a_candidate():
    assert BudgetChooser(None, budgets=(4, 8, 16)).initial == 16
    assert BudgetChooser(None).initial == 64


def test_no_draft_wins_where_no_tree_pays_and_a_drafted_round_keeps_measuring():
    # Every tree costs at least twice the AR step (a large batch of a large target) and the drafter
    # expects little: plain decoding's step (NO_DRAFT) has the best rate, except one round after every
    # EXPLORE_EVERY x cost(4) / cost(0) rounds at NO_DRAFT, which drafts at the best budget so that
    # acceptance keeps being measured; each exploring round after which NO_DRAFT still wins doubles that
    # spacing, up to EXPLORE_BACKOFF times.
    chooser = chooser_with(lambda b: 1.0 if b == NO_DRAFT else 2.0 + b / 64)
    assert chooser.choose(1) == 64  # nothing observed yet: the initial budget
    curve = [[0.1 * (i + 1) for i in range(len(AUTO_BUDGETS))]]
    chooser.observe(64, [1], curve)
    for _ in range(NO_DRAFT_AFTER - 1):  # not before NO_DRAFT_AFTER drafted slot-rounds: the cheapest tree
        assert chooser.choose(1) == 4
        chooser.observe(4, [1], curve)
    spacing = EXPLORE_EVERY * (2.0 + 4 / 64)  # rounds at NO_DRAFT before an exploring one, unbacked
    picks = [chooser.choose(1) for _ in range(400)]  # (no observations in between)
    drafted = [i for i, b in enumerate(picks) if b != NO_DRAFT]
    want, at = [], -1
    for factor in (1, 2, 4, 4, 4):
        assert factor <= EXPLORE_BACKOFF
        at += 1 + math.floor(factor * spacing)
        want.append(at)
    assert drafted[:5] == want and {picks[i] for i in drafted} == {4}
    before = (chooser.curve, chooser.observed, chooser.predicted)
    chooser.observe(NO_DRAFT, [1], [[0.0] * len(AUTO_BUDGETS)])  # a round without a draft teaches nothing
    assert (chooser.curve, chooser.observed, chooser.predicted) == before
    # A drafter that pays wins back: drafting at some budget beats the AR step's rate again, and the
    # exploring rounds' spacing starts afresh.
    for _ in range(60):
        chooser.observe(4, [4], [[3.0 + i for i in range(len(AUTO_BUDGETS))]])
    assert chooser.choose(1) != NO_DRAFT and chooser.backoff == 1
    assert BudgetChooser(None, no_draft=False).probes == AUTO_BUDGETS


def test_no_draft_is_weighed_after_enough_slot_rounds():
    # A round of 8 running slots averages 8 requests' acceptance: NO_DRAFT is weighed after NO_DRAFT_AFTER
    # drafted slot-rounds, in NO_DRAFT_AFTER_ROUNDS rounds at least, not after NO_DRAFT_AFTER rounds.
    chooser = chooser_with(lambda b: 1.0 if b == NO_DRAFT else 4.0 + b / 64)
    curve = [[0.1 * (i + 1) for i in range(len(AUTO_BUDGETS))]] * 8
    assert chooser.choose(8) == 64
    chooser.observe(64, [1] * 8, curve)
    assert chooser.choose(8) == 4  # one round of 8 slots: not yet
    chooser.observe(4, [1] * 8, curve)
    assert NO_DRAFT_AFTER_ROUNDS == 2 and chooser.choose(8) == NO_DRAFT


def test_a_stored_profile_without_no_draft_measures_it_once(tmp_path):
    calls = []
    profile = CostProfile("cpu", {2: {4: 1.0, 8: 1.5, 16: 2.0}})
    chooser = BudgetChooser(lambda bucket, b: calls.append((bucket, b)) or 0.5, profile, budgets=(4, 8, 16), log=None)
    assert chooser.costs(2) == {4: 1.0, 8: 1.5, 16: 2.0, NO_DRAFT: 0.5} and calls == [(2, NO_DRAFT)]
    chooser.costs(2)
    assert calls == [(2, NO_DRAFT)]
    # Nothing to measure with: NO_DRAFT is not weighed (never extrapolated from the tree budgets).
    assert NO_DRAFT not in BudgetChooser(None, CostProfile("cpu", {2: {4: 1.0, 8: 1.5}}), budgets=(4, 8), log=None).costs(2)


def test_rounds_without_a_draft_keep_the_drafter_context_and_the_output(tmp_path):
    # Rounds at NO_DRAFT among drafted ones: greedy output is plain decoding's, seeded samples are the
    # same as with drafted rounds only, and the drafter's cache holds the committed tokens' features
    # as if they had been prefilled.
    target = make_target(tmp_path / "target", vocab=64)
    drafter = make_drafter(tmp_path / "drafter", target, 8)
    prompts = [[3, 5, 7, 11], [2, 4, 6], [9, 8, 7, 6, 5]]
    greedy = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    seeded = SamplingParams(temperature=1.0, max_tokens=24, seed=5, ignore_eos=True)
    plain = LLM(str(target), device="cpu", max_num_seqs=3)
    llm = LLM(str(target), device="cpu", draft_model=str(drafter), max_num_seqs=3)
    picks = itertools.cycle([NO_DRAFT, NO_DRAFT, 8, NO_DRAFT, 16])
    llm.engine.budget.choose = lambda bucket: next(picks)
    for params in (greedy, seeded):
        want = [o.token_ids for o in plain.generate(prompt_token_ids=prompts, sampling_params=params)]
        assert [o.token_ids for o in llm.generate(prompt_token_ids=prompts, sampling_params=params)] == want

    t, d = load_target(target, "cpu", torch.float32)[0], load_drafter(drafter, "cpu", torch.float32)
    spec = SpecConfig("ddtree", "auto")
    sp = Speculator(t, d, spec, slots=1, capacity=64, time_stages=False)
    sp.admit(0, prompts[0], greedy, seed=0)
    emitted = [int(sp.state.bonus[0])]
    for _ in range(5):
        result = sp.round(1, NO_DRAFT)
        assert int(result.walk.accepted[0]) == 1
        emitted.append(int(result.walk.emitted[0, 0]))
    n = len(prompts[0]) + 5
    fresh = Speculator(t, d, spec, slots=1, capacity=64, time_stages=False)
    fresh.prefill(0, prompts[0] + emitted[:5])
    for a, b in zip(sp.draft_cache.keys + sp.draft_cache.values, fresh.draft_cache.keys + fresh.draft_cache.values):
        torch.testing.assert_close(a[0, :, :n], b[0, :, :n], rtol=0, atol=1e-5)


def test_eager_rounds_are_their_own_measurement():
    # On the CPU nothing runs only to measure: the first rounds of a bucket go one to each candidate,
    # largest first and the round without a draft last, and each round's time is that budget's cost.
    chooser = BudgetChooser(None, budgets=(4, 8, 16), log=None, measure_by_running=True)
    curve = [[0.5, 0.8, 1.0]]
    for budget, seconds in ((16, 3.0), (8, 2.0), (4, 1.5), (NO_DRAFT, 1.0)):
        assert chooser.choose(1) == budget
        chooser.refine(1, budget, seconds)
        chooser.observe(budget, [2], curve)
    assert chooser.profile.seconds[1] == {16: 3.0, 8: 2.0, 4: 1.5, NO_DRAFT: 1.0}
    assert chooser.choose(1) == 4  # then the rule: (1 + 0.5 r) / 1.5 beats 8's and 16's rates
    chooser.refine(1, 4, 2.5)  # later rounds refine it (EMA)
    assert chooser.profile.seconds[1][4] == pytest.approx(0.9 * 1.5 + 0.1 * 2.5)
    assert chooser.choose(2) == 16  # a new batch bucket measures again


def test_eager_rounds_refine_the_cost_they_ran_at():
    chooser = chooser_with(lambda b: 1.0 + b / 16)
    chooser.costs(1)
    chooser.refine(1, 4, 2.25)  # rounds at budget 4 took 2.25 s, not the measured 1.25
    assert chooser.costs(1)[4] == pytest.approx(0.9 * 1.25 + 0.1 * 2.25)
    assert chooser.costs(1)[8] == pytest.approx(1.5)  # the others keep their measurement
    chooser.refine(2, 4, 9.0)  # a bucket never measured: nothing to refine
    assert 2 not in chooser.profile.seconds


def test_auto_budget_limit_bounds_the_tokens_a_round_verifies_and_its_memory():
    from treeflash.budget import MAX_AUTO_ROUND_TOKENS, ROUND_BYTES_PER_LOGIT, auto_budget_limit

    assert auto_budget_limit(1, 49152, None) == MAX_AUTO_ROUND_TOKENS - 1
    assert auto_budget_limit(32, 49152, None) == MAX_AUTO_ROUND_TOKENS // 32 - 1  # 127: up to budget 64
    # Memory: half of the free bytes over the vocabulary-wide tensors of each verified token.
    free = 2 * 1000 * 151936 * ROUND_BYTES_PER_LOGIT  # room for 1,000 tokens' tensors in half of it
    assert auto_budget_limit(1, 151936, free) == 999 and auto_budget_limit(8, 151936, free) == 1000 // 8 - 1


def test_budgets_over_the_limit_are_neither_measured_nor_chosen():
    measured = []
    chooser = BudgetChooser(lambda bucket, b: measured.append((bucket, b)) or 1.0 + b / 1000, log=None,
                            max_budget=lambda bucket: 4096 // bucket - 1)
    assert chooser.allowed(1) == AUTO_BUDGETS and chooser.allowed(32) == (4, 8, 16, 32, 64)
    chooser.costs(32)
    assert [b for bucket, b in measured if bucket == 32] == [NO_DRAFT, 4, 8, 16, 32, 64]
    assert chooser.choose(32) == 64  # the initial budget, a candidate here
    # A drafter that keeps gaining with every node: the largest candidate, never one over the limit.
    chooser.observe(64, [9], [[float(b) for b in AUTO_BUDGETS]])
    assert chooser.choose(32) == 64 and chooser.choose(1) == 512
    # A stored profile measured without a limit: its larger budgets are not weighed.
    stored = CostProfile("cpu", {32: {NO_DRAFT: 1.0, **{b: 1.0 for b in AUTO_BUDGETS}}})
    small = BudgetChooser(None, stored, log=None, max_budget=lambda bucket: 20)
    assert set(small.costs(32)) == {NO_DRAFT, 4, 8, 16} and small.choose(32) == 16
    # The smallest budget stays a candidate however large the batch.
    assert BudgetChooser(None, log=None, max_budget=lambda bucket: 0).allowed(4096) == (4,)
    # Eager rounds measure by running: only the candidates, largest first.
    eager = BudgetChooser(None, budgets=(4, 8, 16), log=None, measure_by_running=True,
                          max_budget=lambda bucket: 64 // bucket - 1)
    assert eager.choose(4) == 8 and eager.choose(1) == 16


def test_a_cost_profile_is_written_whole_into_a_new_folder(tmp_path):
    path = tmp_path / "profiles" / "p.json"
    CostProfile("NVIDIA H200", {1: {0: 0.5, 64: 1.25}}).save(path)
    assert CostProfile.load(path) == CostProfile("NVIDIA H200", {1: {0: 0.5, 64: 1.25}})
    assert [p.name for p in path.parent.iterdir()] == ["p.json"]  # no part file left beside it


def test_the_default_cost_profile_is_named_after_what_a_round_costs_on(tmp_path, monkeypatch):
    # (On the CPU the engine keeps no profile by default: its rounds measure themselves. The file a CUDA engine
    # would use is computed here with a stand-in device name.)
    from treeflash.engine import default_budget_profile

    monkeypatch.setenv("TREEFLASH_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H200")
    target = make_target(tmp_path / "target", vocab=64)
    drafter = make_drafter(tmp_path / "drafter", target, 8)
    engines = [LLM(str(target), device="cpu", draft_model=str(drafter), max_num_seqs=n).engine for n in (2, 2, 4)]
    paths = [default_budget_profile(e) for e in engines]
    assert paths[0] == paths[1] and paths[0] != paths[2]
    assert paths[0].parent == tmp_path / "cache" / "budget_profiles" and paths[0].suffix == ".json"
    llm = LLM(str(target), device="cpu", draft_model=str(drafter), max_num_seqs=2)
    llm.generate(prompt_token_ids=[[1, 2, 3]], sampling_params=SamplingParams(temperature=0, max_tokens=4))
    assert not (tmp_path / "cache" / "budget_profiles").exists()
    assert llm.warm_up() == 0  # eager rounds: nothing to capture


def test_measured_costs_are_stored_per_bucket_and_found_by_the_next_engine(tmp_path, monkeypatch):
    # The chooser a CUDA engine builds (rounds timed as graph replays), made on the CPU: the runner says it
    # captures, and times rounds by a stand-in.
    from treeflash.engine import default_budget_profile

    monkeypatch.setenv("TREEFLASH_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H200")
    target = make_target(tmp_path / "target", vocab=64)
    drafter = make_drafter(tmp_path / "drafter", target, 8)

    def gpu_like_chooser(timed):
        engine = LLM(str(target), device="cpu", draft_model=str(drafter), max_num_seqs=4).engine
        engine.runner.enabled = True
        engine.runner.time_round = lambda bucket, budget: timed.append((bucket, budget)) or 1e-3 * (1 + budget / 64)
        return engine, engine._budget_chooser(engine.config)

    first = []
    engine, chooser = gpu_like_chooser(first)
    path = default_budget_profile(engine)
    chooser.costs(1)
    assert [b for _, b in first] == [NO_DRAFT, *AUTO_BUDGETS] and path.is_file()
    assert set(CostProfile.load(path).seconds) == {1}
    chooser.costs(1)
    assert len(first) == 1 + len(AUTO_BUDGETS)  # measured once
    second = []
    _, again = gpu_like_chooser(second)
    assert again.costs(1) == chooser.costs(1) and second == []  # found, not measured
    again.costs(4)
    assert {bucket for bucket, _ in second} == {4} and set(CostProfile.load(path).seconds) == {1, 4}


@pytest.mark.parametrize("value", [True, 3])
def test_a_budget_profile_that_is_no_path_is_refused(value):
    from treeflash.engine import EngineConfig

    with pytest.raises(ValueError, match="budget_profile must be a file path"):
        EngineConfig(budget_profile=value)
