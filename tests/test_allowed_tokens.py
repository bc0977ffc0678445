"""allowed_token_ids (vLLM's): only those tokens can be generated, exactly as plain decoding restricted to them
would generate, whatever the method; a dense -inf row beside the logit bias (treeflash/round.py)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from treeflash import SamplingParams
from spec_helpers import chi_square, install_oracle
from test_penalties import PROMPTS, V, _greedy, _llm, exact_joint, pair, reference, sample_joint, small  # noqa: F401

ALLOWED = [2, 3, 7, 12, 30, 41]


def _masked_argmax_loop(hf, prompt, n, params):
    ids = list(prompt)
    for _ in range(n):
        with torch.no_grad():
            logits = hf(torch.tensor([ids])).logits[0, -1]
        masked = torch.full_like(logits, float("-inf"))
        masked[params.allowed_token_ids] = logits[params.allowed_token_ids]
        for token, bias in (params.logit_bias or {}).items():
            masked[token] += bias
        counts = {t: ids[len(prompt):].count(t) for t in set(ids[len(prompt):])}
        ids.append(int(reference(masked, counts, set(prompt), params).argmax()))
    return ids[len(prompt):]


@pytest.mark.parametrize("spec, ngram", [("none", 0), ("dflash", 0), ("ddtree", 0), ("ddtree", 4)])
def test_every_method_draws_only_allowed_tokens_as_plain_decoding_does(pair, spec, ngram, monkeypatch):
    """Greedy equals a masked argmax loop over transformers' logits (with a bias on an allowed and on a
    forbidden token, and a repetition penalty: the mask holds through both); a seeded sample equals plain
    decoding's; the request beside them keeps its tokens."""
    params = [_greedy(16, allowed_token_ids=ALLOWED, logit_bias={7: 3.0, 5: 50.0}, repetition_penalty=1.3),
              SamplingParams(temperature=1.0, max_tokens=16, seed=4, ignore_eos=True, allowed_token_ids=ALLOWED[:3]),
              _greedy(16)]
    plain = [o.token_ids for o in _llm(pair, "none").generate(prompt_token_ids=PROMPTS, sampling_params=params)]
    assert plain[0] == _masked_argmax_loop(pair[2], PROMPTS[0], 16, params[0])
    assert set(plain[0]) <= set(ALLOWED) and set(plain[1]) <= set(ALLOWED[:3]) and len(set(plain[1])) > 1
    free = _llm(pair, "none").generate(prompt_token_ids=PROMPTS[2:], sampling_params=[_greedy(16)])[0].token_ids
    assert plain[2] == free and not set(free) <= set(ALLOWED)
    if spec == "none":
        return
    install_oracle(monkeypatch, {tuple(p): p + t for p, t in zip(PROMPTS, plain)}, 64, decoy_rate=0.3)
    outs = _llm(pair, spec, ngram).generate(prompt_token_ids=PROMPTS, sampling_params=params)
    assert [o.token_ids for o in outs] == plain
    assert sum(o.metrics.mean_acceptance_length for o in outs) / len(outs) > 2.0


def test_log_probs_stay_the_targets_raw_ones(pair):
    """As vLLM's default: log-probs are the raw distribution's, before the mask."""
    out = _llm(pair, "ddtree").generate(prompt_token_ids=PROMPTS[:1], sampling_params=_greedy(
        6, allowed_token_ids=ALLOWED, logprobs=2))[0]
    with torch.no_grad():
        raw = torch.log_softmax(pair[2](torch.tensor([PROMPTS[0] + out.token_ids])).logits[0].float(), -1)
    for j, (token, entry) in enumerate(zip(out.token_ids, out.logprobs)):
        assert abs(entry[token].logprob - raw[len(PROMPTS[0]) - 1 + j, token].item()) < 1e-4


ALLOWED_SAMPLED = SamplingParams(temperature=1.0, allowed_token_ids=[0, 2, 3, 6])


def test_sampled_joint_with_allowed_tokens_is_exact_and_the_test_has_teeth(small):
    counts, tau = sample_joint(small, ALLOWED_SAMPLED)
    stat, df, threshold = chi_square(counts, exact_joint(small[0], ALLOWED_SAMPLED))
    assert tau > 1.5, "the drafts should make rounds accept several tokens"
    assert stat < threshold, (stat, df, threshold)
    allowed = torch.zeros(V, dtype=torch.bool)
    allowed[ALLOWED_SAMPLED.allowed_token_ids] = True
    inside = allowed[:, None, None] & allowed[None, :, None] & allowed[None, None, :]
    assert counts.view(V, V, V)[~inside].sum() == 0  # no forbidden token at any depth
    stat, _, threshold = chi_square(counts, exact_joint(small[0], dataclasses.replace(ALLOWED_SAMPLED,
                                                                                      allowed_token_ids=[0, 2, 3])))
    assert stat > threshold


@pytest.mark.parametrize("bad", [[], [-1], "3", [1.5], [True], 3])
def test_bad_allowed_token_ids_are_refused(bad):
    with pytest.raises(ValueError, match="allowed_token_ids"):
        SamplingParams(allowed_token_ids=bad)


def test_impossible_allowed_token_ids_are_refused_before_anything_runs(pair):
    llm = _llm(pair, "none")
    with pytest.raises(ValueError, match="outside the vocabulary"):
        llm.generate(prompt_token_ids=PROMPTS[:1], sampling_params=_greedy(4, allowed_token_ids=[3, 64]))
    with pytest.raises(ValueError, match="all stop tokens"):
        llm.generate(prompt_token_ids=PROMPTS[:1], sampling_params=SamplingParams(
            max_tokens=4, min_tokens=2, stop_token_ids=[3], allowed_token_ids=[3]))
    assert llm.generate(prompt_token_ids=PROMPTS[:1], sampling_params=_greedy(3))[0].token_ids  # nothing lost
