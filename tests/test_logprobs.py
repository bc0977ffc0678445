"""Log-probs of generated tokens (SamplingParams.logprobs): every method reports, for every token, the
log-prob and rank the target gives it after the tokens before it (checked against transformers' forward over
prompt + output), and asking for them changes no token of any request in the batch."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from treeflash import LLM, SamplingParams
from treeflash.logprobs import COLUMNS, MAX_LOGPROBS, TokenPieces, pack, unpack
from spec_helpers import hf_greedy, install_oracle, load_hf, make_drafter, make_target

PROMPTS = [[3, 5, 7, 11], [2, 4, 6], [9, 8, 7, 6, 5, 4, 3, 2, 1]]
# (spec, tree_budget, ngram_tokens): plain decoding, the chain, a tree, a tree with prompt lookup, auto
METHODS = [("none", 8, 0), ("dflash", 8, 0), ("ddtree", 8, 0), ("ddtree", 8, 4), ("ddtree", "auto", 0)]


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    root = tmp_path_factory.mktemp("logprobs")
    # A peaky head: the random drafter is accepted now and then, so rounds emit more than one token.
    target = make_target(root / "target", vocab=64, head_scale=4.0)
    return target, make_drafter(root / "drafter", target, 4), load_hf(target)


def _llm(pair, spec, budget, ngram):
    target, drafter, _ = pair
    extra = {"tree_budget": budget} if spec == "ddtree" else {}
    return LLM(str(target), device="cpu", draft_model=str(drafter) if spec != "none" else None, spec=spec,
               ngram_tokens=ngram, max_num_seqs=2, **extra)


def test_pack_and_unpack_give_log_softmax_rank_and_the_most_likely_tokens():
    logits = torch.randn(3, 5, 100, generator=torch.Generator().manual_seed(0)) * 3
    tokens = torch.randint(0, 100, (3, 5), generator=torch.Generator().manual_seed(1))
    packed = pack(logits, tokens)
    assert packed.shape == (3, 5, COLUMNS) and packed.dtype == torch.int64
    reference = torch.log_softmax(logits, -1)
    for s in range(3):
        for d in range(5):
            token, row = tokens[s, d].item(), reference[s, d]
            entry = unpack(packed[s, d].tolist(), token, 4)
            assert list(entry)[0] == token
            assert entry[token].logprob == pytest.approx(row[token].item(), abs=1e-6)
            # vLLM's rank (1 = the most likely), on the logits
            assert entry[token].rank == int((logits[s, d] >= logits[s, d, token]).sum())
            others = [t for t in entry if t != token or entry[t].rank <= 4]
            best = row.topk(4).indices.tolist()
            assert set(entry) == {token} | set(best) and len(entry) == 4 + (token not in best)
            assert all(entry[t].rank == best.index(t) + 1 for t in best if t != token) and others


def test_a_vocabulary_smaller_than_the_most_alternatives_pads():
    logits = torch.randn(2, 7)
    packed = pack(logits, torch.tensor([1, 6]))
    assert packed.shape == (2, COLUMNS)
    entry = unpack(packed[0].tolist(), 1, MAX_LOGPROBS)
    assert set(entry) == set(range(7))  # every token, no padding id
    assert math.isclose(sum(math.exp(e.logprob) for e in entry.values()), 1.0, rel_tol=1e-5)


@pytest.mark.parametrize("value", [-1, MAX_LOGPROBS + 1, 1.5, True, "3"])
def test_bad_logprobs_are_refused(value):
    with pytest.raises(ValueError, match="logprobs"):
        SamplingParams(logprobs=value)


@pytest.mark.parametrize("spec, budget, ngram", METHODS)
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_every_method_reports_the_targets_log_prob_of_each_token(pair, spec, budget, ngram, temperature,
                                                                  monkeypatch):
    hf = pair[2]
    # Drafts that are mostly right (a side branch now and then): rounds emit several tokens, each from its
    # own node's logits.
    if spec != "none":
        install_oracle(monkeypatch, {tuple(p): p + hf_greedy(hf, p, 14) for p in PROMPTS}, 64, decoy_rate=0.3)
    params = SamplingParams(temperature=temperature, top_k=20 if temperature else -1, max_tokens=14,
                            ignore_eos=True, seed=5, logprobs=3)
    outs = _llm(pair, spec, budget, ngram).generate(prompt_token_ids=PROMPTS, sampling_params=params)
    rounds = 0
    for prompt, out in zip(PROMPTS, outs):
        assert len(out.logprobs) == len(out.token_ids) == 14
        with torch.no_grad():
            reference = torch.log_softmax(hf(torch.tensor([prompt + out.token_ids])).logits[0].float(), -1)
        for j, (token, entry) in enumerate(zip(out.token_ids, out.logprobs)):
            row = reference[len(prompt) - 1 + j]  # the distribution the j-th token was drawn from
            assert list(entry)[0] == token and len(entry) in (3, 4)
            assert abs(entry[token].logprob - row[token].item()) < 1e-4
            assert entry[token].rank == int((row >= row[token] - 1e-6).sum())
            best = row.topk(3).indices.tolist()
            assert set(entry) - {token} <= set(best)
        assert math.isclose(out.cumulative_logprob, sum(e[t].logprob for t, e in zip(out.token_ids, out.logprobs)))
        rounds += out.metrics.rounds
    if spec != "none" and temperature == 0:  # (rounds of several tokens were checked)
        assert rounds < 3 * 13 // 2


@pytest.mark.parametrize("spec, budget, ngram", [METHODS[0], METHODS[2]])
def test_asking_for_log_probs_changes_no_token_of_any_request(pair, spec, budget, ngram):
    plain = [SamplingParams(temperature=t, max_tokens=12, ignore_eos=True, seed=9 + i)
             for i, t in enumerate((0.0, 1.0, 0.7))]
    asked = [plain[0], SamplingParams(**{**plain[1].__dict__, "logprobs": 0}), plain[2]]
    want = [o.token_ids for o in _llm(pair, spec, budget, ngram).generate(prompt_token_ids=PROMPTS,
                                                                          sampling_params=plain)]
    outs = _llm(pair, spec, budget, ngram).generate(prompt_token_ids=PROMPTS, sampling_params=asked)
    assert [o.token_ids for o in outs] == want
    assert outs[0].logprobs is None and outs[2].logprobs is None and outs[0].cumulative_logprob is None
    assert all(len(entry) == 1 for entry in outs[1].logprobs)  # logprobs=0: the generated token alone


def test_a_stop_cuts_the_log_probs_with_the_tokens(pair):
    llm = _llm(pair, "ddtree", 8, 0)
    free = llm.generate(prompt_token_ids=PROMPTS[:1], sampling_params=SamplingParams(
        temperature=0, max_tokens=12, ignore_eos=True))[0].token_ids
    stop = free[5]
    out = llm.generate(prompt_token_ids=PROMPTS[:1], sampling_params=SamplingParams(
        temperature=0, max_tokens=12, stop_token_ids=[stop], logprobs=2))[0]
    assert out.token_ids == free[:free.index(stop) + 1] and len(out.logprobs) == len(out.token_ids)


class _ByteLevel:
    """A byte-level BPE tokenizer's two calls TokenPieces makes: token 0 is 'Ġhi', token 1 half of 'é'."""

    def convert_ids_to_tokens(self, token):
        return ["Ġhi", "Ã", "<0x41>"][token]

    def decode(self, ids, skip_special_tokens=False):
        return {0: " hi", 1: "\ufffd", 2: "A"}[ids[0]]


def test_token_pieces_give_each_tokens_own_bytes():
    pieces = TokenPieces(_ByteLevel())
    assert pieces.bytes(0) == list(b" hi") and pieces.text(0) == " hi"
    assert pieces.bytes(1) == [0xC3]  # the first byte of "é", not the replacement character's
    assert pieces.bytes(2) == [0x41]  # a SentencePiece byte token


# --- prompt log-probs (SamplingParams.prompt_logprobs) ----------------------------------------------------
def _prompt_reference(hf, prompt):
    with torch.no_grad():
        return torch.log_softmax(hf(torch.tensor([prompt])).logits[0].float(), -1)


def _check_prompt_entries(entries, prompt, reference, top):
    assert len(entries) == len(prompt) and entries[0] is None  # nothing predicts the first token
    for p in range(1, len(prompt)):
        token, entry, row = prompt[p], entries[p], reference[p - 1]
        assert list(entry)[0] == token
        assert abs(entry[token].logprob - row[token].item()) < 1e-4
        assert entry[token].rank == int((row >= row[token] - 1e-6).sum())
        best = row.topk(top).indices.tolist() if top else []
        assert set(entry) - {token} <= set(best) and len(entry) in (top, top + 1) if top else len(entry) == 1


@pytest.mark.parametrize("chunk", [None, 3])
@pytest.mark.parametrize("spec, budget, ngram", [METHODS[0], METHODS[3]])
def test_prompt_log_probs_are_the_targets_at_every_prompt_position(pair, spec, budget, ngram, chunk):
    """Every prompt token but the first gets its log-prob and rank under the target's forward over the prompt,
    whether the prompt is prefilled in one piece or in chunks (the chunk's last position predicts the next
    chunk's first token), batched with requests that do not ask; their tokens do not change."""
    hf = pair[2]
    llm = _llm(pair, spec, budget, ngram)
    if chunk:
        llm.engine.config = dataclasses.replace(llm.engine.config, prefill_chunk=chunk)
    plain = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    asked = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True, prompt_logprobs=2, logprobs=1)
    want = [o.token_ids for o in llm.generate(prompt_token_ids=PROMPTS, sampling_params=plain)]
    outs = llm.generate(prompt_token_ids=PROMPTS, sampling_params=[asked, plain, asked])
    assert [o.token_ids for o in outs] == want
    assert outs[1].prompt_logprobs is None
    for i in (0, 2):
        _check_prompt_entries(outs[i].prompt_logprobs, PROMPTS[i], _prompt_reference(hf, PROMPTS[i]), 2)
        assert len(outs[i].logprobs) == 6  # the generated tokens' own, as before


def test_prompt_log_probs_of_a_one_token_prompt_and_with_zero_alternatives(pair):
    hf = pair[2]
    outs = _llm(pair, "ddtree", 8, 0).generate(prompt_token_ids=[[5], PROMPTS[2]], sampling_params=SamplingParams(
        temperature=1.0, seed=3, max_tokens=4, prompt_logprobs=0))
    assert outs[0].prompt_logprobs == [None]
    _check_prompt_entries(outs[1].prompt_logprobs, PROMPTS[2], _prompt_reference(hf, PROMPTS[2]), 0)


@pytest.mark.parametrize("value", [-1, MAX_LOGPROBS + 1, 2.0, False])
def test_bad_prompt_logprobs_are_refused(value):
    with pytest.raises(ValueError, match="prompt_logprobs"):
        SamplingParams(prompt_logprobs=value)
