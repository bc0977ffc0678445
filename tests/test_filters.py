"""The sampling filters against an independent NumPy statement of vLLM's v1 semantics.

The specification (SamplingParams' docstring): temperature, then min_p (against the top token's
probability), then top_k (ties with the k-th kept), then top_p on the renormalised remainder (the
smallest most likely set reaching top_p, ties ranked by the larger token id first). `spec` restates
it in float64 with plain Python loops; `processed_probs` must agree on every combination of filters.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from treeflash.sampling import SamplingParams, SamplingTensors, processed_probs


def spec(logits: np.ndarray, p: SamplingParams) -> tuple[np.ndarray, float]:
    """The processed distribution of one row, and the smallest margin of its decisions (how far the
    nearest min_p / top_p comparison was from flipping)."""
    x = logits.astype(np.float64) / p.temperature
    probs = np.exp(x - x.max())
    probs /= probs.sum()
    margin = np.inf
    alive = np.ones(len(x), dtype=bool)
    if p.min_p > 0:
        ratio = probs / probs.max()
        alive &= ratio >= p.min_p
        margin = min(margin, np.abs(ratio - p.min_p).min())
    if p.top_k > 0:
        values = sorted(x[alive], reverse=True)
        if len(values) > p.top_k:
            alive &= x >= values[p.top_k - 1]
    q = np.where(alive, probs, 0.0)
    q /= q.sum()
    if p.top_p < 1:
        ranked = sorted(range(len(q)), key=lambda i: (q[i], i), reverse=True)
        kept, before = np.zeros(len(q), dtype=bool), 0.0
        for i in ranked:
            if q[i] == 0:
                break
            margin = min(margin, abs(before - p.top_p))
            kept[i] = before < p.top_p
            before += q[i]
        q = np.where(kept, q, 0.0)
        q /= q.sum()
    return q, margin


def ours(logits: np.ndarray, params: list[SamplingParams]) -> np.ndarray:
    st = SamplingTensors.build(params, list(range(len(params))), "cpu")
    return processed_probs(torch.tensor(logits, dtype=torch.float32), st).double().numpy()


def support(probs: np.ndarray) -> list[int]:
    return np.flatnonzero(probs > 0).tolist()


def logits_of(probs: list[float]) -> np.ndarray:
    return np.log(np.array(probs, dtype=np.float64)).astype(np.float32)


# --- the examples and the tie rule -------------------------------------------------------------
def test_min_p_applies_before_top_p():
    # min_p=.5 keeps [.30 .25 .20] (floor .15), renormalised to [.40 .33 .27]; top_p=.6 then keeps two.
    # Applied after top_p (the old order) it kept three.
    logits = logits_of([0.30, 0.25, 0.20] + [0.05] * 5)
    params = SamplingParams(top_p=0.6, min_p=0.5)
    assert support(ours(logits[None], [params])[0]) == [0, 1]
    assert support(spec(logits, params)[0]) == [0, 1]


@pytest.mark.parametrize("probs,top_p,kept", [
    ([0.4, 0.2, 0.2, 0.2], 0.5, [0, 3]),              # the example: 2 tokens, not all 4
    ([0.1, 0.2, 0.2, 0.2, 0.1, 0.2], 0.5, [2, 3, 5]),  # the tied tokens with the larger ids win
    ([0.25] * 4, 0.3, [2, 3]),
    ([0.25] * 4, 0.25, [3]),                          # exactly reaching top_p: one token suffices
])
def test_top_p_keeps_exactly_the_smallest_set_ties_by_larger_id(probs, top_p, kept):
    logits = logits_of(probs)
    params = SamplingParams(top_p=top_p)
    assert support(ours(logits[None], [params])[0]) == kept
    assert support(spec(logits, params)[0]) == kept


def test_top_p_ties_match_hugging_face():
    """transformers' TopPLogitsWarper (a stable ascending sort, like vLLM's reference) on tie-heavy rows."""
    from transformers.generation.logits_process import TopPLogitsWarper

    rng = np.random.default_rng(5)
    checked = 0
    for _ in range(300):
        logits = (rng.integers(-6, 6, size=9) / 2).astype(np.float32)
        top_p = float(rng.uniform(0.05, 0.99))
        params = SamplingParams(top_p=top_p)
        want, margin = spec(logits, params)
        if margin < 1e-4:
            continue
        hf = TopPLogitsWarper(top_p)(None, torch.tensor(logits)[None])[0]
        assert support(want) == torch.nonzero(hf > -torch.inf).flatten().tolist()
        assert support(ours(logits[None], [params])[0]) == support(want)
        checked += 1
    assert checked > 250


def test_top_k_keeps_ties_with_the_kth():
    logits = np.array([3.0, 2.0, 2.0, 2.0, 1.0, 0.0], dtype=np.float32)
    params = SamplingParams(top_k=2)
    assert support(ours(logits[None], [params])[0]) == [0, 1, 2, 3] == support(spec(logits, params)[0])


# --- every combination of filters, on random tie-heavy rows --------------------------------------------
COMBINATIONS = list(itertools.product([False, True], repeat=3))  # (top_k, top_p, min_p) on or off


@pytest.mark.parametrize("use_k,use_p,use_min_p", COMBINATIONS,
                         ids=[f"k{int(a)}-p{int(b)}-min{int(c)}" for a, b, c in COMBINATIONS])
@pytest.mark.parametrize("vocab", [5, 12])
def test_every_filter_combination_matches_the_numpy_specification(use_k, use_p, use_min_p, vocab):
    rng = np.random.default_rng(hash((use_k, use_p, use_min_p, vocab)) % 2**32)
    rows = 400
    # Logits on a grid of quarters: many exact ties, and distinct values stay distinct after / T.
    logits = (rng.integers(-12, 12, size=(rows, vocab)) / 4).astype(np.float32)
    params = [SamplingParams(temperature=float(rng.choice([0.5, 0.8, 1.0, 1.7])),
                             top_k=int(rng.integers(1, vocab + 2)) if use_k else -1,
                             top_p=float(rng.uniform(0.05, 0.99)) if use_p and rng.random() < 0.9 else 1.0,
                             min_p=float(rng.uniform(0.01, 0.9)) if use_min_p and rng.random() < 0.9 else 0.0)
              for _ in range(rows)]
    got = ours(logits, params)  # one batch: rows with a filter off sit beside rows with it on
    compared, cut = 0, 0
    for row, p in enumerate(params):
        want, margin = spec(logits[row], p)
        if margin < 1e-5:  # float32 arithmetic may fall either side of so close a call
            continue
        assert support(got[row]) == support(want), (logits[row].tolist(), p)
        np.testing.assert_allclose(got[row], want, rtol=1e-5, atol=1e-7)
        compared += 1
        cut += len(support(want)) < vocab
    assert compared > 0.9 * rows
    if use_k or use_p or use_min_p:
        assert cut > rows // 4, "the filters should bite"


def test_a_large_vocabulary_cut_matches_the_specification():
    """At a Qwen-sized vocabulary the top_p masses are summed in float64: the cut lands where float64 says."""
    rng = np.random.default_rng(1)
    logits = (rng.standard_normal((3, 151936)) * 2.5).astype(np.float32)
    params = [SamplingParams(top_p=0.9), SamplingParams(top_p=0.5, min_p=0.01), SamplingParams(top_k=50, top_p=0.8)]
    got = ours(logits, params)
    for row, p in enumerate(params):
        want, margin = spec(logits[row], p)
        if margin > 1e-6:
            assert support(got[row]) == support(want)


def test_the_cpu_candidates_keep_what_the_full_sort_keeps():
    """Off CUDA top_p sorts only the tokens at or above (1 - top_p) * total / V: the same nucleus as the full
    sort CUDA runs, flat rows (where nearly every token is a candidate) and ties at the boundary included."""
    from treeflash.sampling import _top_p_candidates
    from treeflash.sampling import _top_p_sorted as full_sort_keep

    gen = torch.Generator().manual_seed(11)
    rows = [torch.softmax(torch.randn(6, 5000, generator=gen) * scale, -1) for scale in (0.1, 1.0, 4.0)]
    ties = torch.tensor([0.0, 1.0, 2.0, 4.0])[torch.randint(0, 4, (6, 777), generator=gen)]
    rows.append(torch.nn.functional.pad(ties / ties.sum(-1, keepdim=True), (0, 5000 - 777)))
    probs = torch.cat(rows)
    top_p = torch.tensor([0.05, 0.3, 0.5, 0.9, 0.999, 1.0] * 4, dtype=torch.float64)
    assert torch.equal(_top_p_candidates(probs, top_p), full_sort_keep(probs, top_p))
    three = probs[:3].view(3, 1, 5000).expand(3, 2, 5000)  # leading dims, top_p broadcast over them
    assert torch.equal(_top_p_candidates(three, top_p[:3, None]), full_sort_keep(three, top_p[:3, None].expand(3, 2)))


def test_the_full_sort_keeps_the_same_tokens_a_few_rows_at_a_time():
    """CUDA's top_p sorts rows in groups of at most `TOP_P_SORT_ELEMENTS` elements (bounding the memory a large
    batch's round needs): the same mask as one sort of every row, ties, top_p = 1 and leading dimensions included."""
    from treeflash.sampling import _top_p_sorted

    gen = torch.Generator().manual_seed(5)
    rows = [torch.softmax(torch.randn(4, 3000, generator=gen) * scale, -1) for scale in (0.1, 1.0, 4.0)]
    ties = torch.tensor([0.0, 1.0, 2.0, 4.0])[torch.randint(0, 4, (4, 3000), generator=gen)]
    probs = torch.cat(rows + [ties / ties.sum(-1, keepdim=True)]).view(2, 8, 3000)
    top_p = torch.tensor([0.05, 0.3, 0.5, 0.9, 0.999, 1.0, 0.7, 0.2] * 2, dtype=torch.float64).view(2, 8)
    whole = _top_p_sorted(probs, top_p, elements=16 * 3000)
    assert whole.shape == probs.shape and whole[top_p == 1.0].all()
    for elements in (1, 3000, 3 * 3000 + 1, 5 * 3000):
        assert torch.equal(_top_p_sorted(probs, top_p, elements=elements), whole)
    one_per_row = _top_p_sorted(probs, top_p[:, :1], elements=3000)  # (top_p broadcast over the nodes)
    assert torch.equal(one_per_row, _top_p_sorted(probs, top_p[:, :1].expand(2, 8)))
