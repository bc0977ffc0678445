"""The draw is exact to double precision: total variation bounded over the whole uniform grid.

The uniforms are u_k = (2k + 1) / 2^53 for k in [0, 2^52), so a sampler is a function of k, and the
probability it gives token i is (number of k it maps to i) / 2^52. An exact inverse CDF maps u to i
on [C_{i-1}, C_i), C the exact cumulative sum, so it switches from token i to the next one at
k*_i = #{k : u_k < C_i}, computed here in integer arithmetic from the float32 probabilities (dyadic
rationals). The sampler is an inverse CDF too, monotone in u. If, at every one of the 151,936
switch points of a Qwen-sized distribution, it gives token <= i at k*_i - W and token > i at
k*_i + W, its own switch lies within W grid steps of the exact one, so every token's count is
within 2W of the exact interval's and the total variation is at most V (2W + 1) / 2^53. A sample of
switch points is then located exactly, to report the offsets it really has.
"""

from __future__ import annotations

from itertools import accumulate

import numpy as np
import pytest
import torch

from helpers import one_thread
from treeflash.sampling import SamplingParams, SamplingTensors, derive, draw_uniforms, inverse_cdf

GRID = 1 << 52  # grid points
VOCAB = 151936  # Qwen2.5 / Qwen3
WINDOW = 64  # grid steps: the bound below is V * (2 * WINDOW + 1) / 2^53 = 2.2e-9


@pytest.fixture(scope="module", autouse=True)
def _single_thread():
    with one_thread():
        yield


def qwen_sized_distribution(seed: int = 0) -> np.ndarray:
    """float32 probabilities over 151,936 tokens: logits with std 2.5 (as in the issue), 300 tokens
    forced to 1e-12 .. 1e-9 and 2,000 to exactly zero (as a top-k or min-p cut leaves them)."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(VOCAB) * 2.5
    p = np.exp(x - x.max())
    p /= p.sum()
    tiny = rng.choice(VOCAB, 300, replace=False)
    p[tiny] = 10.0 ** rng.uniform(-12, -9, size=300)
    p[rng.choice(np.setdiff1d(np.arange(VOCAB), tiny), 2000, replace=False)] = 0.0
    return p.astype(np.float32)


def grid_u(k: np.ndarray) -> torch.Tensor:
    return torch.tensor((2 * k + 1).astype(np.float64) * 2.0 ** -53)


def exact_switch_points(probs: np.ndarray) -> tuple[list[int], list[int], int]:
    """Integer masses m_i (probs = m / 2^149 exactly), and k*_i = #{k : u_k < C_i} for every token."""
    m = [int(v) for v in probs.astype(np.float64) * 2.0 ** 149]  # float32 values are multiples of 2^-149
    cum = list(accumulate(m))
    total = cum[-1]
    # u_k < C_i  <=>  (2k + 1) * total < cum_i * 2^53: count the odd n <= (cum_i * 2^53 - 1) // total.
    switch = [min(((c << 53) - 1) // total + 1, 1 << 53) // 2 for c in cum]
    return m, switch, total


def chunked(draw, ks: np.ndarray) -> np.ndarray:
    return np.concatenate([draw(grid_u(ks[s:s + 8192])) for s in range(0, len(ks), 8192)])


def within_window(draw, probs: np.ndarray) -> bool:
    """Does the draw switch from token <= i to token > i within WINDOW grid steps of every exact
    switch point? Also checks that no probe returns a zero-probability token."""
    m, switch, _ = exact_switch_points(probs)
    boundaries = np.array([i for i, v in enumerate(m) if v > 0][:-1])  # after each positive token but the last
    k = np.array([switch[i] for i in boundaries], dtype=np.int64)
    below = chunked(draw, np.clip(k - WINDOW, 0, GRID - 1))
    above = chunked(draw, np.clip(k + WINDOW, 0, GRID - 1))
    assert (probs[below] > 0).all() and (probs[above] > 0).all(), "a zero-probability token was drawn"
    return bool((below <= boundaries).all() and (above > boundaries).all())


def switch_offsets(draw, probs: np.ndarray, boundaries: np.ndarray) -> np.ndarray:
    """Where exactly the draw switches after each token in `boundaries`, minus the exact switch point
    (binary search inside the window, which `within_window` has checked)."""
    _, switch, _ = exact_switch_points(probs)
    exact = np.array([switch[i] for i in boundaries], dtype=np.int64)
    lo, hi = exact - WINDOW, exact + WINDOW  # draw(lo) <= i < draw(hi)
    while (hi - lo > 1).any():
        mid = (lo + hi) // 2
        past = chunked(draw, mid) > boundaries
        hi, lo = np.where(past, mid, hi), np.where(past, lo, mid)
    return hi - exact


def test_the_draw_is_exact_to_double_precision_at_a_qwen_sized_vocabulary():
    probs = qwen_sized_distribution()
    p = torch.tensor(probs)[None]
    draw = lambda u: inverse_cdf(p, u[None])[0].numpy()  # noqa: E731
    assert within_window(draw, probs), f"the sampler's CDF is off by more than {WINDOW} grid steps somewhere"
    bound = VOCAB * (2 * WINDOW + 1) / 2 ** 53
    assert bound <= 1e-6
    # Every token with p >= 1e-12 has over 4,500 grid points, more than the 2 * WINDOW it can lose.
    assert 1e-12 * GRID > 2 * WINDOW + 1
    # The offsets it really has, at 2,000 switch points located exactly.
    m, _, total = exact_switch_points(probs)
    positive = [i for i, v in enumerate(m) if v > 0][:-1]
    sample = np.sort(np.random.default_rng(0).choice(positive, 2000, replace=False))
    offsets = switch_offsets(draw, probs, sample)
    estimate = np.abs(offsets).mean() * VOCAB / GRID
    print(f"V={VOCAB}: total variation <= {bound:.1e} (bound over every switch point); switch offsets "
          f"{offsets.min()}..{offsets.max()} grid steps, mean |offset| {np.abs(offsets).mean():.2f} "
          f"-> total variation about {estimate:.1e}")
    assert np.abs(offsets).max() <= 8


def test_a_float32_cumulative_sum_fails_the_same_check():
    """Teeth: the old sampler's float32 CDF (even with the 53-bit uniforms) is far off the exact
    switch points, so the same check refuses it."""
    probs = qwen_sized_distribution(1)
    cdf = torch.tensor(probs).cumsum(0)

    def draw(u):
        idx = torch.searchsorted(cdf, (u * cdf[-1].double()).float(), right=True)
        return torch.minimum(idx, torch.tensor(int(np.flatnonzero(probs)[-1]))).numpy()

    assert not within_window(draw, probs)


def test_uniforms_are_on_the_odd_2_to_the_53_grid():
    seeds = torch.tensor([[s & 0xFFFFFFFF, s >> 32] for s in (0, 7, 1 << 40, (1 << 64) - 1)])
    positions = torch.arange(50000).expand(4, -1)
    u = draw_uniforms(seeds, positions)
    assert u.dtype == torch.float64 and ((u > 0) & (u < 1)).all()
    n = (u * 2.0 ** 53).to(torch.int64)
    assert torch.equal(n.double() * 2.0 ** -53, u) and (n % 2 == 1).all()  # exactly (2k + 1) / 2^53
    k = n // 2
    # All 52 bits are random: the low 20 (from the second hash) as much as the high ones.
    assert len(torch.unique(k & 0xFFFFF)) > 0.9 * k.numel() * (1 - k.numel() / 2 ** 21)
    assert abs(u.mean().item() - 0.5) < 0.005 and abs((k & 1).double().mean().item() - 0.5) < 0.01


def test_derive_draws_a_rare_token_at_its_rate():
    """Through derive (float64 uniforms keyed by position): a token of probability 1e-4 beside a
    dominant one appears at its rate, and the masked tokens never."""
    vocab, n = 16, 400000
    logits = torch.full((vocab,), -40.0)
    logits[3], logits[7] = 0.0, float(np.log(1e-4 / (1 - 1e-4)))
    st = SamplingTensors.build([SamplingParams(seed=1, top_k=2)], [1], "cpu")
    tokens = derive(logits.expand(1, n, vocab), st, torch.arange(n)[None])[0]
    assert set(tokens.unique().tolist()) == {3, 7}
    hits = int((tokens == 7).sum())
    assert abs(hits - n * 1e-4) < 5 * (n * 1e-4) ** 0.5


@pytest.mark.parametrize("seed", [-1, 1 << 64, 1 << 70])
def test_seeds_outside_64_bits_are_refused(seed):
    with pytest.raises(ValueError, match=r"seed must be in \[0, 2\*\*64\)"):
        SamplingParams(seed=seed)


def test_64_bit_seeds_are_accepted():
    assert SamplingParams(seed=0).seed == 0 and SamplingParams(seed=(1 << 64) - 1).seed == (1 << 64) - 1
