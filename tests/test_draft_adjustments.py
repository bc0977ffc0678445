"""The drafter proposes under the request's own logit adjustments where they are known before the tree
(`Speculator.adjusted_drafts`): the bias row (logit_bias, allowed_token_ids), penalties from the output so far,
min_tokens' stop tokens by depth. Drafts only shape the tree (the target derives every token), so the tokens
never change, with the adjustment or without; benchmarks/cpu-draft-adjustments measures what it does to
acceptance with the shipped pair."""

from __future__ import annotations

import pytest
import torch

from treeflash import SamplingParams
from treeflash.round import SpecConfig, Speculator
from test_penalties import PROMPTS, _greedy, _llm, pair, small  # noqa: F401


def _speculator(small) -> Speculator:
    _, target, drafter = small
    sp = Speculator(target, drafter, SpecConfig("ddtree", 8), slots=3, capacity=64, time_stages=False)
    params = [SamplingParams(temperature=0, logit_bias={1: 2.0}, allowed_token_ids=[0, 1, 2, 5], min_tokens=3,
                             repetition_penalty=1.5, frequency_penalty=0.5, stop_token_ids=[2]),
              SamplingParams(temperature=0), SamplingParams(temperature=0, allowed_token_ids=[7])]
    sp.set_sampling_many([0, 1, 2], params, [0, 0, 0], [[1, 3, 4]] * 3, [{2}, set(), set()])
    sp.penalty_counts.output[0, 5] = 2  # token 5 generated twice
    sp.state.seq_lens.fill_(3)  # min_tokens 3 after a 3-token prompt: stop tokens from position 6 on
    return sp


def test_drafts_take_the_bias_the_penalties_and_min_tokens_of_their_slot(small):
    sp = _speculator(small)
    logits = torch.randn(3, 4, 8, generator=torch.Generator().manual_seed(0))
    got = sp.adjusted_drafts(logits, sp.sampling(3), sp.state)
    want = torch.full((4, 8), float("-inf"))
    for t in (0, 1, 2, 5):
        x = logits[0, :, t] + (2.0 if t == 1 else 0.0)
        if t in (1, 3, 4, 5):  # seen: the prompt's or the output's
            x = torch.where(x > 0, x / 1.5, x * 1.5)
        want[:, t] = x - (0.5 * 2 if t == 5 else 0.0)
    want[:2, 2] = float("-inf")  # depths 1 and 2 are drawn at positions 4 and 5, before 6
    torch.testing.assert_close(got[0], want)
    assert torch.equal(got[1], logits[1])  # a slot without adjustments: bit for bit
    assert torch.isfinite(got[2]).sum() == 4 and torch.isfinite(got[2, :, 7]).all()
    sp.adjust_drafts = False
    assert sp.adjusted_drafts(logits, sp.sampling(3), sp.state) is logits


def test_a_draft_vocabulary_takes_its_columns_and_a_row_left_empty_keeps_the_drafters(small):
    sp = _speculator(small)
    sp.draft_tokens = torch.tensor([5, 1, 0, 3])
    logits = torch.randn(3, 4, 4, generator=torch.Generator().manual_seed(1))
    got = sp.adjusted_drafts(logits, sp.sampling(3), sp.state)
    assert torch.isinf(got[0, :, 3]).all() and torch.isfinite(got[0, :, :3]).all()  # 3 is not allowed
    assert got[0, 0, 1] == pytest.approx(max(logits[0, 0, 1] + 2, 0) / 1.5 + min(logits[0, 0, 1] + 2, 0) * 1.5)
    assert torch.equal(got[2], logits[2])  # its one allowed token (7) is not in the draft vocabulary


@pytest.mark.parametrize("spec, ngram", [("dflash", 0), ("ddtree", 0), ("ddtree", 4)])
def test_adjusted_or_blind_drafts_give_plain_decodings_tokens(pair, spec, ngram):
    params = [_greedy(16, repetition_penalty=1.4, logit_bias={7: 3.0}, min_tokens=4, stop_token_ids=[9]),
              SamplingParams(temperature=0.9, max_tokens=16, seed=4, ignore_eos=True, presence_penalty=0.8,
                             allowed_token_ids=list(range(0, 64, 2))),
              _greedy(16)]
    plain = [o.token_ids for o in _llm(pair, "none").generate(prompt_token_ids=PROMPTS, sampling_params=params)]
    for adjust in (True, False):
        llm = _llm(pair, spec, ngram)
        llm.engine.speculator.adjust_drafts = adjust
        assert [o.token_ids for o in llm.generate(prompt_token_ids=PROMPTS, sampling_params=params)] == plain
