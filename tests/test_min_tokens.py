"""min_tokens (vLLM's): no stop token is drawn and nothing stops a request before it has this many tokens;
every method gives plain decoding's tokens (and transformers' min_new_tokens) with it."""

from __future__ import annotations

import pytest
import torch

from treeflash import LLM, SamplingParams
from spec_helpers import install_oracle, load_hf, make_drafter, make_target

PROMPTS = [[3, 5, 7, 11], [2, 4, 6], [9, 8, 7, 6, 5, 4, 3, 2, 1]]


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    root = tmp_path_factory.mktemp("min-tokens")
    target = make_target(root / "target", vocab=64, head_scale=4.0)
    drafter = make_drafter(root / "drafter", target, 4)
    # The end-of-sequence token: the one plain greedy decoding of the first prompt emits third, so that
    # requests end early unless min_tokens holds them.
    free = LLM(str(target), device="cpu").generate(prompt_token_ids=PROMPTS[:1], sampling_params=SamplingParams(
        temperature=0, max_tokens=3, ignore_eos=True))[0].token_ids
    return target, drafter, load_hf(target), free[2]


def _llm(pair, spec, ngram=0):
    extra = {"tree_budget": 8} if spec == "ddtree" else {}
    return LLM(str(pair[0]), device="cpu", draft_model=str(pair[1]) if spec != "none" else None, spec=spec,
               ngram_tokens=ngram, max_num_seqs=2, **extra)


def test_a_stop_token_waits_for_min_tokens_as_in_transformers(pair):
    stop = pair[3]
    params = SamplingParams(temperature=0, max_tokens=24, stop_token_ids=[stop], min_tokens=10)
    early = _llm(pair, "none").generate(prompt_token_ids=PROMPTS[:1], sampling_params=SamplingParams(
        temperature=0, max_tokens=24, stop_token_ids=[stop]))[0]
    assert len(early.token_ids) == 3 and early.finish_reason == "stop"
    for prompt, out in zip(PROMPTS, _llm(pair, "none").generate(prompt_token_ids=PROMPTS, sampling_params=params)):
        assert len(out.token_ids) >= 10 and stop not in out.token_ids[:9]
        want = pair[2].generate(torch.tensor([prompt]), max_new_tokens=24, do_sample=False, min_new_tokens=10,
                                eos_token_id=stop, pad_token_id=0)[0, len(prompt):].tolist()
        assert out.token_ids == want


@pytest.mark.parametrize("spec, ngram", [("dflash", 0), ("ddtree", 0), ("ddtree", 4)])
def test_every_method_gives_plain_decodings_tokens_with_min_tokens(pair, spec, ngram, monkeypatch):
    stop = pair[3]
    params = [SamplingParams(temperature=0, max_tokens=20, stop_token_ids=[stop], min_tokens=8),
              SamplingParams(temperature=0.9, max_tokens=20, seed=3, stop_token_ids=[stop], min_tokens=12),
              SamplingParams(temperature=0, max_tokens=20, stop_token_ids=[stop])]
    plain = [o.token_ids for o in _llm(pair, "none").generate(prompt_token_ids=PROMPTS, sampling_params=params)]
    install_oracle(monkeypatch, {tuple(p): p + t for p, t in zip(PROMPTS, plain)}, 64, decoy_rate=0.3)
    outs = _llm(pair, spec, ngram).generate(prompt_token_ids=PROMPTS, sampling_params=params)
    assert [o.token_ids for o in outs] == plain


def test_a_stop_string_waits_for_min_tokens_too(tmp_path):
    from helpers import make_tiny_target

    path = make_tiny_target(tmp_path / "chars", tokenizer=True)
    llm = LLM(str(path), device="cpu")
    free = llm.generate("the tree", SamplingParams(temperature=0, max_tokens=16, ignore_eos=True))[0].text
    stop = free[1:3]  # a string the greedy text holds from its second character
    early = llm.generate("the tree", SamplingParams(temperature=0, max_tokens=16, ignore_eos=True, stop=[stop]))[0]
    held = llm.generate("the tree", SamplingParams(temperature=0, max_tokens=16, ignore_eos=True, stop=[stop],
                                                   min_tokens=6))[0]
    assert len(early.token_ids) < 6 and len(held.token_ids) >= 6
    # (a character tokenizer: token k ends at character k) The first occurrence whose last token comes at
    # or after the sixth ends the request, the text cut before it; without one, the whole text.
    later = [i for i in range(len(free) - 1) if free[i:i + 2] == stop and i + 2 >= 6]
    assert held.text == (free[:later[0]] if later else free)


@pytest.mark.parametrize("bad", [dict(min_tokens=-1), dict(min_tokens=20, max_tokens=10), dict(min_tokens=1.5)])
def test_bad_min_tokens_are_refused(bad):
    with pytest.raises(ValueError, match="min_tokens"):
        SamplingParams(**bad)
