"""The round runner and the static per-slot state it relies on.

On the CPU the runner's fallback must be exactly the eager round (it is the same call); the static
sampling rows and their flags follow admissions and releases; measuring a round leaves the slots as
they were. The CUDA graph path itself is checked on a GPU by scripts/gpu_check.py.
"""

from __future__ import annotations

import pytest
import torch

from treeflash.checkpoint import load_drafter, load_target
from treeflash.round import SamplingFlags, SpecConfig, Speculator
from treeflash.runner import GraphRunner, default_buckets
from treeflash.sampling import SamplingParams
from spec_helpers import make_drafter, make_target

PROMPTS = [[3, 5, 7, 11], [2, 4, 6], [9, 8, 7, 6, 5]]
PARAMS = [SamplingParams(temperature=0), SamplingParams(temperature=0.8, top_k=5, top_p=0.9),
          SamplingParams(temperature=1.0, min_p=0.05)]


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    root = tmp_path_factory.mktemp("runner")
    target = make_target(root / "target", vocab=64)
    drafter = make_drafter(root / "drafter", target, 8)
    return load_target(target, "cpu", torch.float32)[0], load_drafter(drafter, "cpu", torch.float32)


def speculator(pair, spec: SpecConfig) -> Speculator:
    target, drafter = pair
    sp = Speculator(target, drafter if spec.method != "none" else None, spec, slots=4, capacity=128,
                    time_stages=False)
    for slot, (prompt, params) in enumerate(zip(PROMPTS, PARAMS)):
        sp.admit(slot, prompt, params, seed=100 + slot)
    return sp


@pytest.mark.parametrize("spec", [SpecConfig("none"), SpecConfig("dflash"), SpecConfig("ddtree", 12),
                                  SpecConfig("ddtree", "auto")])
def test_runner_fallback_is_the_eager_round(pair, spec):
    eager, wrapped = speculator(pair, spec), speculator(pair, spec)
    runner = GraphRunner(wrapped)
    assert not runner.enabled  # CPU: no graphs
    budget = 16 if spec.auto else None
    for _ in range(4):
        a, b = eager.round(3, budget), runner.round(3, budget)
        for x, y in [(a.walk.emitted, b.walk.emitted), (a.walk.accepted, b.walk.accepted),
                     (a.tree.tokens, b.tree.tokens), (eager.state.seq_lens, wrapped.state.seq_lens),
                     (eager.state.bonus, wrapped.state.bonus)]:
            assert torch.equal(x, y)
        assert (a.predicted is None) == (b.predicted is None) == (not spec.auto)
        if spec.auto:
            assert torch.equal(a.predicted, b.predicted)
            assert torch.all(a.predicted[:, 1:] >= a.predicted[:, :-1])  # more nodes, more expected drafts


@pytest.mark.parametrize("spec", [SpecConfig("none"), SpecConfig("ddtree", "auto")])
def test_a_round_writes_its_readback_into_the_runners_buffer(pair, spec):
    """A captured round writes what the host reads into a buffer the runner allocated outside the graphs'
    shared pool (a replay of another graph may overwrite any block inside it): the same rows, in place."""
    eager, into = speculator(pair, spec), speculator(pair, spec)
    budget = 16 if spec.auto else None
    out = torch.full_like(eager.round(3, budget).readback, -1)
    eager = speculator(pair, spec)
    for _ in range(3):
        a, b = eager.round(3, budget), into.round(3, budget, readback_out=out)
        assert b.readback.data_ptr() == out.data_ptr()
        assert torch.equal(a.readback, out)


def test_time_round_leaves_the_slots_as_they_were(pair):
    sp = speculator(pair, SpecConfig("ddtree", "auto"))
    seq_lens, bonus = sp.state.seq_lens.clone(), sp.state.bonus.clone()
    seconds = GraphRunner(sp).time_round(3, 64, repeats=2)
    assert seconds > 0
    assert torch.equal(sp.state.seq_lens, seq_lens) and torch.equal(sp.state.bonus, bonus)


def test_sampling_rows_and_flags_follow_the_running_requests(pair):
    sp = speculator(pair, SpecConfig("none"))
    assert sp.flags == SamplingFlags(all_greedy=False, use_top_k=True, use_top_p=True, use_min_p=True, max_top_k=8)
    rows = sp.sampling(3)
    assert rows.top_k.tolist() == [0, 5, 0] and rows.greedy.tolist() == [True, False, False]
    assert rows.seed[:, 0].tolist() == [100, 101, 102]
    sp.release(1)
    assert sp.flags == SamplingFlags(all_greedy=False, use_min_p=True)
    assert sp.sampling(4).greedy.tolist() == [True, True, False, True]
    sp.release(2)
    sp.release(0)
    assert sp.flags == SamplingFlags()  # nothing runs: greedy


def test_buckets():
    assert default_buckets(1) == (1,)
    assert default_buckets(8) == (1, 2, 4, 8)
    assert default_buckets(12) == (1, 2, 4, 8, 12)


def test_a_budget_is_required_with_auto(pair):
    sp = speculator(pair, SpecConfig("ddtree", "auto"))
    with pytest.raises(ValueError, match="auto"):
        sp.round(3)
