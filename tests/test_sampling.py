"""Sampling: parameter validation, the processed distribution, the counter-based draw, and stops.

Statistical tests use a chi-square statistic with bins of expected count < 10 merged and the loose
threshold df + 10 * sqrt(2 df): a correct sampler essentially never fails it, and the tests that
deliberately compare against a wrong distribution show that it still has teeth.
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest
import torch

from helpers import char_text, hf_model, make_tiny_target, one_thread
from treeflash import LLM, SamplingParams
from treeflash.sampling import SamplingTensors, derive, draw_uniforms, processed_probs, sample_from


@pytest.fixture(scope="module", autouse=True)
def _single_thread():
    with one_thread():
        yield


# --- SamplingParams validation ------------------------------------------------------------------

INVALID_PARAMS = [
    ({"temperature": -0.1}, "temperature must be >= 0"),
    ({"temperature": float("nan")}, "temperature must be a finite number"),
    ({"temperature": float("inf")}, "temperature must be a finite number"),
    ({"temperature": "1.0"}, "temperature must be a finite number"),
    ({"temperature": True}, "temperature must be a finite number"),
    ({"top_p": 0.0}, r"top_p must be in \(0, 1\]"),
    ({"top_p": 1.5}, r"top_p must be in \(0, 1\]"),
    ({"top_p": -0.2}, r"top_p must be in \(0, 1\]"),
    ({"top_p": float("nan")}, "top_p must be a finite number"),
    ({"top_p": False}, "top_p must be a finite number"),
    ({"top_k": -2}, r"top_k must be -1 or 0 \(off, as in vLLM\) or at least 1"),
    ({"top_k": 2.0}, "top_k must be an integer"),
    ({"top_k": True}, "top_k must be an integer"),
    ({"min_p": -0.01}, r"min_p must be in \[0, 1\]"),
    ({"min_p": 1.01}, r"min_p must be in \[0, 1\]"),
    ({"min_p": float("inf")}, "min_p must be a finite number"),
    ({"min_p": True}, "min_p must be a finite number"),
    ({"max_tokens": 0}, "max_tokens must be at least 1"),
    ({"max_tokens": -3}, "max_tokens must be at least 1"),
    ({"max_tokens": 4.0}, "max_tokens must be an integer"),
    ({"max_tokens": True}, "max_tokens must be an integer"),
    ({"seed": 1.5}, "seed must be an integer"),
    ({"seed": False}, "seed must be an integer"),
    ({"stop": ""}, "stop strings must not be empty"),
    ({"stop": ["ok", ""]}, "stop strings must not be empty"),
    ({"stop": ["ok", 3]}, "stop must be a string or a list of strings"),
    ({"stop": 7}, "stop must be a string or a list of strings"),
    ({"stop_token_ids": [1, -1]}, "stop_token_ids must be a list of non-negative token ids"),
    ({"stop_token_ids": [1, 2.0]}, "stop_token_ids must be a list of non-negative token ids"),
    ({"stop_token_ids": [True]}, "stop_token_ids must be a list of non-negative token ids"),
    ({"stop_token_ids": 5}, "stop_token_ids must be a list of non-negative token ids"),
    ({"ignore_eos": 1}, "ignore_eos must be a bool"),
    ({"ignore_eos": "yes"}, "ignore_eos must be a bool"),
]


@pytest.mark.parametrize("kwargs, message", INVALID_PARAMS, ids=[str(k) for k, _ in INVALID_PARAMS])
def test_invalid_sampling_params_are_rejected(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SamplingParams(**kwargs)


def test_valid_sampling_params_are_normalised():
    p = SamplingParams(temperature=0, top_k=-1, top_p=1, min_p=1, max_tokens=1, stop="x", stop_token_ids=(3, 4))
    assert p.greedy and p.stop == ["x"] and p.stop_token_ids == [3, 4]
    assert not SamplingParams(temperature=1e-3).greedy


# --- tiny models ----------------------------------------------------------------------------------

SMALL_VOCAB = 16


@pytest.fixture(scope="module")
def small_dir(tmp_path_factory) -> Path:
    """One Llama layer, 16 tokens: distributions spread over several tokens, conditionals depend on the prefix."""
    return make_tiny_target(tmp_path_factory.mktemp("small") / "m", "llama", vocab_size=SMALL_VOCAB,
                            hidden_size=16, num_layers=1, num_heads=2, num_kv_heads=1, intermediate_size=32,
                            seed=3, logit_scale=0.6)


@pytest.fixture(scope="module")
def small_llm(small_dir) -> LLM:
    return LLM(small_dir, device="cpu", max_num_seqs=64)


@pytest.fixture(scope="module")
def small_hf(small_dir):
    return hf_model(small_dir)


@torch.no_grad()
def next_logits(hf, prefixes: list[list[int]]) -> torch.Tensor:
    """The reference (transformers) next-token logits after each prefix: [len(prefixes), V]."""
    return torch.stack([hf(torch.tensor([p])).logits[0, -1] for p in prefixes]).float()


def probs_for(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """processed_probs for one SamplingParams over logits [..., V]."""
    st = SamplingTensors.build([params], [0], logits.device)
    shape = logits.shape[:-1]
    st = st.rows(torch.zeros(shape, dtype=torch.long))
    return processed_probs(logits, st)


# --- chi-square -----------------------------------------------------------------------------------

def chi_square(counts: torch.Tensor, probs: torch.Tensor) -> tuple[float, int]:
    """Pearson statistic and degrees of freedom; bins with expected count < 10 are merged into one.

    counts, probs: flat tensors over the same bins. A count on a zero-probability bin is infinite.
    """
    counts, probs = counts.double().flatten(), probs.double().flatten()
    n = counts.sum()
    if (counts[probs == 0] > 0).any():
        return math.inf, 1
    expected = probs * n
    big = expected >= 10
    obs = counts[big].tolist()
    exp = expected[big].tolist()
    small_obs, small_exp = counts[~big & (probs > 0)].sum().item(), expected[~big & (probs > 0)].sum().item()
    if small_exp > 0:
        if small_exp >= 10 or not exp:
            obs.append(small_obs)
            exp.append(small_exp)
        else:  # too small even pooled: fold it into the smallest regular bin
            i = min(range(len(exp)), key=exp.__getitem__)
            obs[i] += small_obs
            exp[i] += small_exp
    stat = sum((o - e) ** 2 / e for o, e in zip(obs, exp))
    return stat, max(len(exp) - 1, 1)


def chi_square_ok(counts: torch.Tensor, probs: torch.Tensor) -> bool:
    stat, df = chi_square(counts, probs)
    return stat < df + 10 * math.sqrt(2 * df)


def assert_distribution(counts: torch.Tensor, probs: torch.Tensor) -> None:
    stat, df = chi_square(counts, probs)
    assert stat < df + 10 * math.sqrt(2 * df), f"chi-square {stat:.1f} with {df} degrees of freedom"


def token_counts(tokens, vocab: int) -> torch.Tensor:
    return torch.bincount(torch.as_tensor(tokens).flatten(), minlength=vocab)


def test_chi_square_has_teeth():
    """Draws from one distribution fail against a slightly different one, and pass against their own."""
    gen = torch.Generator().manual_seed(0)
    p = torch.softmax(torch.randn(12, generator=gen), -1)
    q = torch.softmax(torch.log(p) / 0.9, -1)  # temperature 0.9 instead of 1
    draws = torch.multinomial(p, 20000, replacement=True, generator=gen)
    assert chi_square_ok(token_counts(draws, 12), p)
    assert not chi_square_ok(token_counts(draws, 12), q)


# --- processed_probs ------------------------------------------------------------------------------

def logits_of(probs: list[float]) -> torch.Tensor:
    return torch.tensor(probs, dtype=torch.float64).log().float()


def support(probs: torch.Tensor) -> list[int]:
    return torch.nonzero(probs > 0).flatten().tolist()


def test_top_p_1_and_min_p_0_is_plain_softmax_of_logits_over_temperature():
    logits = torch.randn(3, 40, generator=torch.Generator().manual_seed(1)) * 3
    for t in (0.3, 1.0, 1.7):
        out = probs_for(logits, SamplingParams(temperature=t))
        assert torch.equal(out, torch.softmax(logits / t, -1))


def test_unfiltered_row_in_a_filtered_batch_keeps_the_plain_softmax():
    logits = torch.randn(2, 40, generator=torch.Generator().manual_seed(2)) * 3
    st = SamplingTensors.build([SamplingParams(temperature=0.8), SamplingParams(top_p=0.5, min_p=0.1, top_k=5)],
                               [0, 1], "cpu")
    out = processed_probs(logits, st)
    torch.testing.assert_close(out[0], torch.softmax(logits[0] / 0.8, -1), rtol=1e-6, atol=1e-7)
    assert len(support(out[1])) <= 5


def test_top_k_keeps_exactly_the_k_largest():
    logits = torch.tensor([0.5, 3.0, -1.0, 2.0, 1.0, 2.5])
    out = probs_for(logits, SamplingParams(top_k=3))
    assert support(out) == [1, 3, 5]
    torch.testing.assert_close(out[[1, 3, 5]], torch.softmax(logits[[1, 3, 5]], -1))
    assert support(probs_for(logits, SamplingParams(top_k=1))) == [1]
    assert support(probs_for(logits, SamplingParams(top_k=100))) == list(range(6))
    # 0 is off, as in vLLM; so is a k past any vocabulary, even past int64 (it failed the whole batch).
    assert SamplingParams(top_k=0).top_k == -1
    for k in (0, (1 << 31) - 1, 1 << 31, 1 << 64):
        assert support(probs_for(logits, SamplingParams(top_k=k))) == list(range(6)), k


def test_top_k_keeps_tokens_tied_with_the_kth():
    logits = torch.tensor([3.0, 2.0, 2.0, 2.0, 1.0, 0.0])
    assert support(probs_for(logits, SamplingParams(top_k=2))) == [0, 1, 2, 3]


def test_top_p_keeps_the_smallest_prefix_reaching_p():
    logits = logits_of([0.1, 0.5, 0.15, 0.25])  # sorted: 0.5, 0.25, 0.15, 0.1
    assert support(probs_for(logits, SamplingParams(top_p=0.4))) == [1]
    assert support(probs_for(logits, SamplingParams(top_p=0.7))) == [1, 3]
    assert support(probs_for(logits, SamplingParams(top_p=0.85))) == [1, 2, 3]
    assert support(probs_for(logits, SamplingParams(top_p=0.95))) == [0, 1, 2, 3]
    out = probs_for(logits, SamplingParams(top_p=0.7))
    torch.testing.assert_close(out[[1, 3]], torch.tensor([2 / 3, 1 / 3]))


def test_top_p_breaks_ties_by_the_larger_token_id():
    # Four equal tokens: two reach 0.3, and of a tie the larger ids rank first (vLLM, Hugging Face).
    logits = torch.zeros(4)
    assert support(probs_for(logits, SamplingParams(top_p=0.3))) == [2, 3]


def test_min_p_keeps_tokens_with_at_least_min_p_times_the_top_probability():
    logits = logits_of([0.4, 0.3, 0.2, 0.06, 0.04])
    assert support(probs_for(logits, SamplingParams(min_p=0.4))) == [0, 1, 2]  # floor 0.16
    assert support(probs_for(logits, SamplingParams(min_p=0.12))) == [0, 1, 2, 3]  # floor 0.048
    out = probs_for(logits, SamplingParams(min_p=0.4))
    torch.testing.assert_close(out[:3], torch.tensor([4 / 9, 3 / 9, 2 / 9]))
    assert support(probs_for(logits, SamplingParams(min_p=1.0))) == [0]


def test_filters_apply_after_temperature():
    # At T=1 the top-0.8 set is 3 tokens; at T=0.5 the distribution sharpens to [.53, .30, .13, .03]: 2 tokens.
    logits = logits_of([0.4, 0.3, 0.2, 0.1])
    assert support(probs_for(logits, SamplingParams(top_p=0.8))) == [0, 1, 2]
    assert support(probs_for(logits, SamplingParams(temperature=0.5, top_p=0.8))) == [0, 1]


def test_top_p_applies_after_top_k():
    # After top_k=2 the pair renormalises to [.57, .43]: top_p=0.5 keeps one. The other order keeps two.
    logits = logits_of([0.4, 0.3, 0.2, 0.1])
    assert support(probs_for(logits, SamplingParams(top_k=2, top_p=0.5))) == [0]


def test_min_p_applies_before_top_p():
    # min_p=0.3 (floor .12) drops 0.1 first; top_p=0.75 on the renormalised [.44, .33, .22] keeps two.
    # Applied after top_p, min_p would have kept three.
    logits = logits_of([0.4, 0.3, 0.2, 0.1])
    assert support(probs_for(logits, SamplingParams(top_p=0.75, min_p=0.3))) == [0, 1]


# (tests/test_filters.py checks every filter combination against an independent NumPy specification.)


# --- sample_from and the counter-based uniforms ---------------------------------------------------

def test_sample_from_never_returns_a_zero_probability_token():
    probs = torch.tensor([0.0, 0.3, 0.0, 0.0, 0.5, 0.2, 0.0])
    eps = 2.0 ** -25
    us = [0.0, 1e-30, eps, 0.3 - 1e-7, 0.3, 0.3 + 1e-7, 0.8, 1 - eps, 1 - 1e-12, 1.0]
    tokens = sample_from(probs.expand(len(us), -1), torch.tensor(us))
    assert all(probs[t] > 0 for t in tokens.tolist()), tokens
    # Mass that does not sum to one (rounding) must not push a draw past the last non-zero token.
    tokens = sample_from((probs * 0.999).expand(len(us), -1), torch.tensor(us))
    assert all(probs[t] > 0 for t in tokens.tolist()), tokens


def test_sample_from_single_token_support_always_returns_it():
    probs = torch.zeros(9)
    probs[4] = 1.0
    u = torch.tensor([1e-9, 0.5, 1 - 2.0 ** -24])
    assert sample_from(probs.expand(3, -1), u).tolist() == [4, 4, 4]


def test_draw_uniforms_are_strictly_inside_the_unit_interval_and_depend_on_every_input():
    seeds = torch.tensor([[s & 0xFFFFFFFF, s >> 32] for s in (0, 1, 1 << 32, (1 << 64) - 1)])
    positions = torch.arange(6).expand(4, 6)
    u = draw_uniforms(seeds, positions)
    assert ((u > 0) & (u < 1)).all()
    assert len(set(u.flatten().tolist())) == u.numel()  # seed high bits, low bits and position all matter
    assert not torch.equal(u, draw_uniforms(seeds, positions + 1))
    torch.testing.assert_close(u, draw_uniforms(seeds, positions.clone()), rtol=0, atol=0)
    # Keyed by position only: nodes drawing the same position (siblings) share their uniform.
    assert torch.equal(draw_uniforms(seeds, torch.full((4, 3), 9)), draw_uniforms(seeds, torch.full((4, 1), 9)).expand(4, 3))



def test_each_position_maps_seeds_one_to_one_onto_64_bits_so_the_52_bit_uniform_is_exact():
    """The uniform's 52 bits are the top of a 64-bit block that the seed's two halves go through by a
    bijection (a Feistel network, whatever the position): undoing the rounds gives the seed back. So a
    uniformly random seed makes every 52-bit value equally likely, not just 2^32 of them."""
    from treeflash.sampling import _MASK32, _ROUND_SALTS, _feistel, _fmix32

    gen = torch.Generator().manual_seed(3)
    seed = torch.randint(0, 1 << 32, (4096, 2), generator=gen)
    key = _fmix32((torch.randint(0, 1 << 40, (4096, 1), generator=gen) & _MASK32) ^ 0x9E3779B9)
    left, right = _feistel(seed[:, :1], seed[:, 1:], key)
    for salt in reversed(_ROUND_SALTS):
        left, right = right ^ _fmix32(left ^ key ^ salt), left
    assert torch.equal(torch.cat([left, right], 1), seed)


def test_the_uniforms_low_bits_are_not_a_function_of_their_high_bits():
    # Reachable values, seen from outside: among 2^18 random seeds at one position, those whose uniforms
    # agree in their top 32 of 52 bits (~8 pairs by the birthday bound) differ below them. An earlier
    # hash derived the low 20 bits from the same 32-bit state as the high ones: such pairs always agreed.
    gen = torch.Generator().manual_seed(11)
    seeds = torch.randint(0, 1 << 32, (1 << 18, 2), generator=gen)
    k = ((draw_uniforms(seeds, torch.full((1 << 18, 1), 77)) * 2.0 ** 53 - 1) / 2)[:, 0].long()
    high, order = torch.sort(k >> 20)
    k = k[order]
    same_high = (high[1:] == high[:-1]).nonzero()[:, 0]
    assert len(same_high) >= 2
    assert (k[same_high] != k[same_high + 1]).all()

# --- derive: the per-node draw matches the processed distribution ---------------------------------

DIST_CASES = [
    SamplingParams(temperature=1.0),
    SamplingParams(temperature=0.7),
    SamplingParams(temperature=1.0, top_k=6),
    SamplingParams(temperature=0.7, top_p=0.8),
    SamplingParams(temperature=1.0, min_p=0.05),
    SamplingParams(temperature=0.7, top_k=10, top_p=0.9, min_p=0.02),
]


def seeded(params: SamplingParams, n: int, first_seed: int = 0) -> SamplingTensors:
    return SamplingTensors.build([params] * n, list(range(first_seed, first_seed + n)), "cpu")


@pytest.mark.parametrize("params", DIST_CASES, ids=lambda p: f"T{p.temperature}-k{p.top_k}-p{p.top_p}-min{p.min_p}")
def test_derived_tokens_follow_the_processed_distribution(params):
    vocab, n = 24, 20000
    logits = torch.randn(vocab, generator=torch.Generator().manual_seed(5)) * 1.5
    tokens = derive(logits.expand(n, 1, vocab), seeded(params, n), torch.zeros(n, 1, dtype=torch.long))
    probs = probs_for(logits, params)
    counts = token_counts(tokens, vocab)
    assert set(support(counts)) <= set(support(probs))
    assert_distribution(counts, probs)
    # Teeth: the same draws fail against the distribution at a somewhat higher temperature.
    hotter = SamplingParams(temperature=params.temperature * 1.3, top_k=params.top_k, top_p=params.top_p,
                            min_p=params.min_p)
    assert not chi_square_ok(counts, probs_for(logits, hotter))


def test_derive_draws_at_different_positions_are_independent():
    """Two nodes drawing different positions (a parent and its child): the joint of their tokens is the product."""
    vocab, n = 8, 20000
    gen = torch.Generator().manual_seed(6)
    logits = torch.randn(2, vocab, generator=gen) * 1.2
    params = SamplingParams(temperature=0.9)
    tokens = derive(logits.expand(n, 2, vocab), seeded(params, n), torch.tensor([[7, 8]]).expand(n, 2))
    p = probs_for(logits, params)
    assert_distribution(token_counts(tokens[:, 0] * vocab + tokens[:, 1], vocab * vocab), torch.outer(p[0], p[1]))


def test_derive_consecutive_positions_draw_fresh_randomness():
    """The root of consecutive rounds draws consecutive positions: independent draws (joint = product)."""
    vocab, n = 8, 20000
    logits = torch.randn(vocab, generator=torch.Generator().manual_seed(7))
    st = seeded(SamplingParams(), n)
    first = derive(logits.expand(n, 1, vocab), st, torch.zeros(n, 1, dtype=torch.long))[:, 0]
    second = derive(logits.expand(n, 1, vocab), st, torch.ones(n, 1, dtype=torch.long))[:, 0]
    p = torch.softmax(logits, -1)
    assert_distribution(token_counts(first * vocab + second, vocab * vocab), torch.outer(p, p))


def test_derive_greedy_rows_take_the_argmax_beside_sampled_rows():
    logits = torch.randn(4, 3, 10, generator=torch.Generator().manual_seed(8))
    params = [SamplingParams(temperature=0), SamplingParams(temperature=1.0), SamplingParams(temperature=0),
              SamplingParams(temperature=2.0, top_k=1)]
    tokens = derive(logits, SamplingTensors.build(params, [1, 2, 3, 4], "cpu"), torch.arange(3).expand(4, 3))
    assert torch.equal(tokens[[0, 2, 3]], logits[[0, 2, 3]].argmax(-1))


# --- through the engine: seeds -------------------------------------------------------------------

def sampled(seed, **kw) -> SamplingParams:
    return SamplingParams(temperature=kw.pop("temperature", 1.0), max_tokens=kw.pop("max_tokens", 12),
                          seed=seed, ignore_eos=True, **kw)


def test_same_seed_gives_the_same_tokens(small_llm):
    prompt = [[1, 2, 3, 4]]
    a = small_llm.generate(prompt_token_ids=prompt, sampling_params=sampled(42))[0].token_ids
    b = small_llm.generate(prompt_token_ids=prompt, sampling_params=sampled(42))[0].token_ids
    assert a == b and len(a) == 12


def test_seeded_request_is_reproducible_whatever_else_is_in_the_batch(small_dir):
    prompt, target = [5, 6, 7], sampled(1234, top_k=8, top_p=0.95)
    alone = LLM(small_dir, device="cpu").generate(prompt_token_ids=[prompt], sampling_params=target)[0].token_ids
    others = [([9, 9, 1], SamplingParams(temperature=0, max_tokens=5, ignore_eos=True)),
              ([2], sampled(7, temperature=0.5)),
              ([3, 4, 5, 6, 7, 8], sampled(None, max_tokens=20)),
              ([1, 1], sampled(99, min_p=0.2, max_tokens=3))]
    for max_num_seqs in (1, 2, 8):
        for position in (0, 2, 4):
            batch = others[:position] + [(prompt, target)] + others[position:]
            llm = LLM(small_dir, device="cpu", max_num_seqs=max_num_seqs)
            outs = llm.generate(prompt_token_ids=[p for p, _ in batch], sampling_params=[s for _, s in batch])
            assert outs[position].token_ids == alone, (max_num_seqs, position)


def test_different_seeds_give_different_tokens(small_llm):
    outs = small_llm.generate(prompt_token_ids=[[1, 2, 3]] * 6, sampling_params=[sampled(s) for s in range(6)])
    assert len({tuple(o.token_ids) for o in outs}) >= 5


def test_unseeded_requests_differ(small_llm):
    outs = small_llm.generate(prompt_token_ids=[[1, 2, 3]] * 4, sampling_params=sampled(None, max_tokens=16))
    assert len({tuple(o.token_ids) for o in outs}) >= 3


# --- through the engine: distributions ------------------------------------------------------------

FILTERS = [SamplingParams(top_k=3), SamplingParams(top_p=0.6), SamplingParams(min_p=0.3),
           SamplingParams(temperature=1.3, top_k=6, top_p=0.8, min_p=0.1)]


@pytest.mark.parametrize("filt", FILTERS, ids=lambda p: f"T{p.temperature}-k{p.top_k}-p{p.top_p}-min{p.min_p}")
def test_filtered_sampling_never_emits_a_token_outside_the_allowed_set(small_llm, small_hf, filt):
    """Every generated token (first token and later rounds) lies in the support of the processed
    distribution at its own context, computed by transformers."""
    params = [SamplingParams(temperature=filt.temperature, top_k=filt.top_k, top_p=filt.top_p, min_p=filt.min_p,
                             max_tokens=6, seed=s, ignore_eos=True) for s in range(150)]
    prompt = [4, 8, 15]
    outs = small_llm.generate(prompt_token_ids=[prompt] * len(params), sampling_params=params)
    smallest_support = SMALL_VOCAB
    with torch.no_grad():
        for out in outs:
            ids = prompt + out.token_ids
            logits = small_hf(torch.tensor([ids])).logits[0, len(prompt) - 1:-1]
            allowed = probs_for(logits, filt) > 0
            assert allowed[torch.arange(len(out.token_ids)), torch.tensor(out.token_ids)].all()
            smallest_support = min(smallest_support, int(allowed.sum(-1).min()))
    assert smallest_support < SMALL_VOCAB // 2  # the filters did bite


ENGINE_CASES = [SamplingParams(temperature=1.0), SamplingParams(temperature=0.7, top_k=8, top_p=0.9, min_p=0.02)]


@pytest.mark.slow  # thousands of requests; test_speculative's engine joint test is the quick check
@pytest.mark.parametrize("base", ENGINE_CASES, ids=["T1", "T0.7-filtered"])
def test_first_generated_token_follows_the_processed_distribution(small_llm, small_hf, base):
    n, prompt = 4000, [3, 1, 4, 1, 5]
    params = [SamplingParams(temperature=base.temperature, top_k=base.top_k, top_p=base.top_p, min_p=base.min_p,
                             max_tokens=1, seed=s, ignore_eos=True) for s in range(n)]
    outs = small_llm.generate(prompt_token_ids=[prompt] * n, sampling_params=params)
    counts = token_counts([o.token_ids[0] for o in outs], SMALL_VOCAB)
    probs = probs_for(next_logits(small_hf, [prompt])[0], base)
    assert_distribution(counts, probs)
    hotter = SamplingParams(temperature=base.temperature * 2, top_k=base.top_k, top_p=base.top_p, min_p=base.min_p)
    assert not chi_square_ok(counts, probs_for(next_logits(small_hf, [prompt])[0], hotter))


@pytest.mark.slow
def test_first_two_generated_tokens_follow_the_product_of_conditionals(small_llm, small_hf):
    """The joint law of (token 1, token 2), against p(t1 | prompt) * p(t2 | prompt, t1).

    Token 1 is drawn at admission and token 2 in the first round: this catches randomness shared
    between the two (for instance the same uniform reused), which a one-token test cannot see.
    """
    n, prompt = 6000, [2, 7, 1, 8]
    params = [SamplingParams(temperature=1.0, max_tokens=2, seed=s, ignore_eos=True) for s in range(n)]
    outs = small_llm.generate(prompt_token_ids=[prompt] * n, sampling_params=params)
    pairs = torch.tensor([o.token_ids for o in outs])
    first = torch.softmax(next_logits(small_hf, [prompt])[0], -1)
    second = torch.softmax(next_logits(small_hf, [prompt + [t] for t in range(SMALL_VOCAB)]), -1)
    joint = first[:, None] * second
    assert_distribution(token_counts(pairs[:, 0] * SMALL_VOCAB + pairs[:, 1], SMALL_VOCAB ** 2), joint)


# --- LLM-level validation -------------------------------------------------------------------------

def test_empty_prompt_is_rejected(small_llm):
    with pytest.raises(ValueError, match="prompt 1 is empty"):
        small_llm.generate(prompt_token_ids=[[1], []])


def test_prompt_filling_max_model_len_is_rejected(small_dir):
    llm = LLM(small_dir, device="cpu", max_model_len=8)
    with pytest.raises(ValueError, match="prompt 0 has 8 tokens; max_model_len is 8"):
        llm.generate(prompt_token_ids=[list(range(8))])
    out = llm.generate(prompt_token_ids=[list(range(6))], sampling_params=SamplingParams(max_tokens=16, ignore_eos=True))
    assert len(out[0].token_ids) == 2 and out[0].finish_reason == "length"  # the context limit cuts max_tokens


@pytest.mark.parametrize("bad", [[1, SMALL_VOCAB], [-1, 2]])
def test_token_ids_outside_the_vocabulary_are_rejected(small_llm, bad):
    with pytest.raises(ValueError, match="outside the vocabulary"):
        small_llm.generate(prompt_token_ids=[[1, 2], bad])


@pytest.mark.parametrize("bad", [[1, 2.0], [True, 2], "12"])
def test_token_ids_that_are_not_integers_are_rejected(small_llm, bad):
    with pytest.raises(ValueError, match=r"prompt_token_ids\[1\] must be a sequence of integer token ids"):
        small_llm.generate(prompt_token_ids=[[1, 2], bad])


def test_numpy_and_torch_token_ids_are_accepted(small_llm):
    import numpy as np

    greedy = SamplingParams(temperature=0, max_tokens=3, ignore_eos=True)
    want = small_llm.generate(prompt_token_ids=[[1, 2, 3]], sampling_params=greedy)[0].token_ids
    for ids in (np.array([1, 2, 3]), torch.tensor([1, 2, 3])):
        assert small_llm.generate(prompt_token_ids=[ids], sampling_params=greedy)[0].token_ids == want


def test_stop_token_ids_outside_the_vocabulary_are_rejected(small_llm):
    with pytest.raises(ValueError, match=r"stop_token_ids \[16\] are outside the vocabulary"):
        small_llm.generate(prompt_token_ids=[[1]], sampling_params=SamplingParams(stop_token_ids=[3, 16]))


def test_number_of_sampling_params_must_match_the_prompts(small_llm):
    with pytest.raises(ValueError, match="got 3 SamplingParams for 2 prompts"):
        small_llm.generate(prompt_token_ids=[[1], [2]], sampling_params=[SamplingParams()] * 3)
    with pytest.raises(ValueError, match="must be a SamplingParams or a dict of its fields, got str"):
        small_llm.generate(prompt_token_ids=[[1]], sampling_params=["greedy"])


def test_prompts_and_prompt_token_ids_are_exclusive(small_llm):
    with pytest.raises(ValueError, match="either prompts .* or prompt_token_ids"):
        small_llm.generate()
    with pytest.raises(ValueError, match="either prompts .* or prompt_token_ids"):
        small_llm.generate("hello", prompt_token_ids=[[1]])
    with pytest.raises(ValueError, match="no prompts given"):
        small_llm.generate(prompt_token_ids=[])


def test_stop_strings_without_a_tokenizer_are_rejected(small_llm):
    with pytest.raises(ValueError, match="stop strings need a tokenizer"):
        small_llm.generate(prompt_token_ids=[[1]], sampling_params=SamplingParams(stop="x"))


@pytest.mark.parametrize("bad", [257, 1, 0, 16.0])
def test_max_model_len_outside_the_models_limit_is_rejected(small_dir, bad):
    # The tiny checkpoints have max_position_embeddings = 256.
    with pytest.raises(ValueError, match=r"max_model_len must be an integer in \[2, 256\]"):
        LLM(small_dir, device="cpu", max_model_len=bad)


@pytest.mark.parametrize("bad", [0, -1, 2.0, True])
def test_max_num_seqs_must_be_a_positive_integer(small_dir, bad):
    with pytest.raises(ValueError, match="max_num_seqs must be a positive integer"):
        LLM(small_dir, device="cpu", max_num_seqs=bad)


# --- stops ----------------------------------------------------------------------------------------

TEXT_VOCAB = 64  # character tokenizer: id 0 = <eos>, then " ", a-z, A-Z, 0-9
GREEDY = dict(temperature=0, max_tokens=32)


@pytest.fixture(scope="module")
def text_dir(tmp_path_factory) -> Path:
    return make_tiny_target(tmp_path_factory.mktemp("text") / "m", "llama", vocab_size=TEXT_VOCAB, seed=11,
                            tokenizer=True)


@pytest.fixture(scope="module")
def text_llm(text_dir) -> LLM:
    return LLM(text_dir, device="cpu")


PROMPT = "the quick brown fox"


@pytest.fixture(scope="module")
def free_run(text_llm) -> list[int]:
    """32 greedy tokens that ignore every stop: what the stop tests cut."""
    return text_llm.generate(PROMPT, SamplingParams(**GREEDY, ignore_eos=True))[0].token_ids


def first_new_token_index(tokens: list[int], start: int = 3) -> int:
    """An index j >= start whose token does not occur before j (and is not <eos>)."""
    for j in range(start, len(tokens)):
        if tokens[j] != 0 and tokens[j] not in tokens[:j]:
            return j
    pytest.fail(f"no fresh token in {tokens}")


def test_text_prompt_is_encoded_with_the_tokenizer(text_llm, free_run):
    out = text_llm.generate(PROMPT, SamplingParams(**GREEDY, ignore_eos=True))[0]
    assert out.prompt == PROMPT and char_text(out.prompt_token_ids) == PROMPT
    assert out.token_ids == free_run and out.text == char_text(free_run)


def test_max_tokens_finishes_with_length(text_llm, free_run):
    out = text_llm.generate(PROMPT, SamplingParams(temperature=0, max_tokens=5, ignore_eos=True))[0]
    assert out.token_ids == free_run[:5] and out.finish_reason == "length"


def test_stop_token_ends_the_output_and_is_not_in_the_text(text_llm, free_run):
    j = first_new_token_index(free_run)
    out = text_llm.generate(PROMPT, SamplingParams(**GREEDY, ignore_eos=True, stop_token_ids=[free_run[j]]))[0]
    assert out.finish_reason == "stop"
    assert out.token_ids == free_run[:j + 1]
    assert out.text == char_text(free_run[:j])


@pytest.mark.parametrize("where", ["config.json", "generation_config.json"])
def test_eos_stops_unless_ignore_eos(tmp_path, text_dir, free_run, where):
    if 0 in free_run:
        pytest.skip("the free run already emits the tokenizer's <eos>")
    j = first_new_token_index(free_run)
    path = tmp_path / "m"
    shutil.copytree(text_dir, path)
    file = path / where
    never = next(t for t in range(1, TEXT_VOCAB) if t not in free_run)  # a list of eos ids, one never emitted
    file.write_text(json.dumps({**json.loads(file.read_text()), "eos_token_id": [never, free_run[j]]}))
    llm = LLM(path, device="cpu")
    stopped = llm.generate(PROMPT, SamplingParams(**GREEDY))[0]
    assert stopped.finish_reason == "stop" and stopped.token_ids == free_run[:j + 1]
    assert stopped.text == char_text(free_run[:j])
    ignored = llm.generate(PROMPT, SamplingParams(**GREEDY, ignore_eos=True))[0]
    assert ignored.finish_reason == "length" and ignored.token_ids == free_run


def test_stop_string_cuts_the_text_before_it(text_llm, free_run):
    text = char_text(free_run)
    j = first_new_token_index(free_run)
    stop = text[j:j + 2]  # two characters = two tokens, completed by token j + 1
    at = text.index(stop)
    out = text_llm.generate(PROMPT, SamplingParams(**GREEDY, ignore_eos=True, stop=["zzzz", stop]))[0]
    assert out.finish_reason == "stop"
    assert out.text == text[:at]
    assert out.token_ids == free_run[:at + 2]  # generation ends with the token that completes the string


def test_stop_string_not_generated_runs_to_length(text_llm, free_run):
    absent = next(s for s in ("QQ", "ZZZ", "0000") if s not in char_text(free_run))
    out = text_llm.generate(PROMPT, SamplingParams(**GREEDY, ignore_eos=True, stop=absent))[0]
    assert out.finish_reason == "length" and out.token_ids == free_run


def test_tiny_temperature_decodes_greedily_instead_of_overflowing():
    """logits / 1e-30 would be inf (NaN probabilities); below 1e-5 a request is greedy, as in vLLM."""
    logits = torch.randn(2, 3, 50, generator=torch.Generator().manual_seed(9)) * 100
    params = [SamplingParams(temperature=1e-30, seed=1), SamplingParams(temperature=5e-6, top_p=0.5, seed=2)]
    assert all(p.greedy for p in params) and not SamplingParams(temperature=1e-4).greedy
    tokens = derive(logits, SamplingTensors.build(params, [1, 2], "cpu"), torch.arange(3).expand(2, 3))
    assert torch.equal(tokens, logits.argmax(-1))
