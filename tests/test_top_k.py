"""The per-depth top-k kernels (treeflash/top_k.py), run by Triton's interpreter on CPU tensors: both methods
give a stable top-k (descending, equal scores lower token first), bit for bit, whatever the row holds
(ties, -inf, signed zeros, a crowded top) and however it is cut. float32 but where said (the interpreter's
bfloat16 arithmetic is not the GPU's; loads of bf16 rows are exact)."""

from __future__ import annotations

import pytest
import torch

from triton_interpreter import mend  # noqa: F401  (first: it turns the interpreter on)
from treeflash import top_k as top_k_module
from treeflash.top_k import FILTER_FROM_VOCAB, filter_plan, top_k_filter, top_k_kernel, top_k_pieces

pytestmark = pytest.mark.usefixtures("mend")
METHODS = [top_k_pieces, top_k_filter]


def stable_top_k(lp: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    # A stable sort of the negated scores; + 0.0 as the kernels' keys count -0.0 as +0.0.
    x = lp.float() + 0.0
    order = (-x).sort(dim=-1, stable=True).indices[..., :k]
    return x.gather(-1, order), order


def check(method, lp: torch.Tensor, k: int, **kw) -> None:
    scores, tokens = method(lp, k, **kw)
    assert scores.dtype == torch.float32 and tokens.dtype == torch.long
    assert scores.shape == tokens.shape == (*lp.shape[:2], k)
    want_scores, want_tokens = stable_top_k(lp, k)
    assert torch.equal(scores, want_scores) and torch.equal(tokens, want_tokens)


def logprobs(slots, depths, vocab, seed, levels=None, scale=3.0):
    lp = torch.randn(slots, depths, vocab, generator=torch.Generator().manual_seed(seed)) * scale
    if levels:
        lp = (lp * levels).round() / levels  # few distinct values: ties everywhere
    return lp.log_softmax(-1)


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("slots,depth,vocab,k,levels,dtype", [
    (1, 3, 5000, 16, None, torch.float32),  # three chunks of 2048, the last partial
    (2, 4, 300, 7, 2, torch.float32),  # ties everywhere, k not a power of two
    (2, 2, 4096, 64, None, torch.bfloat16),  # read as bf16, no float32 copy
    (1, 2, 20, 20, 1, torch.float32),  # k = V
    (3, 2, 1000, 1, None, torch.float32),  # the chain's argmax
])
def test_a_stable_top_k(method, slots, depth, vocab, k, levels, dtype):
    lp = logprobs(slots, depth, vocab, vocab + k, levels).to(dtype)
    lp[0, 0, :vocab // 3] = float("-inf")  # probability zero
    check(method, lp, k)
    if not levels and dtype == torch.float32:  # no ties: what torch.topk gives
        scores, tokens = method(lp, k)
        want_scores, want_tokens = lp.float().topk(k, dim=-1)
        assert torch.equal(scores, want_scores) and torch.equal(tokens, want_tokens)


@pytest.mark.parametrize("method", METHODS)
def test_strided_rows(method):
    check(method, logprobs(2, 6, 3000, 1)[:, ::2], 32)  # depths strided, rows contiguous
    check(method, logprobs(1, 2, 400, 3)[..., ::2], 20)  # tokens strided: copied


@pytest.mark.parametrize("vocab,k,pieces", [(5000, 16, 1), (5000, 16, 4), (300, 8, 16), (20, 20, 8)])
def test_pieces_however_a_row_is_cut(vocab, k, pieces):
    # Pieces past a row's end hold nothing; the merged top-k is the row's.
    check(top_k_pieces, logprobs(2, 3, vocab, vocab, levels=0.5), k, pieces=pieces)


@pytest.mark.parametrize("vocab,k,levels", [(300, 7, 2), (1000, 16, 1), (2000, 100, 4)])
def test_filter_heavy_ties(vocab, k, levels):
    # The bound ties with hundreds of tokens: each program keeps its first k of them, the lowest win.
    check(top_k_filter, logprobs(2, 2, vocab, k, levels=levels), k)


@pytest.mark.parametrize("vocab,k", [(50, 8), (1000, 64), (3000, 17)])
def test_filter_rows_of_minus_infinity(vocab, k):
    lp = logprobs(2, 3, vocab, k)
    lp[0, 0] = float("-inf")  # all -inf: the k lowest tokens, every token tied at the bound
    lp[0, 1, : vocab // 3] = float("-inf")
    lp[1, 0, 3:] = float("-inf")  # three finite tokens, then the lowest -inf ones
    lp[1, 1, :-2] = float("-inf")  # two finite tokens at the end
    check(top_k_filter, lp, k)


def test_filter_certain_tokens_and_signed_zeros():
    lp = logprobs(2, 3, 600, 4)
    lp[0, :, 3] = 0.0
    lp[0, :, 10] = -0.0  # counted as +0.0: both tie at 0.0, token 3 first
    lp[1, 0, 599] = 0.0
    check(top_k_filter, lp, 16)


def test_filter_crowded_top():
    # The whole top k in neighbouring tokens: few blocks hold every candidate above the bound.
    lp = logprobs(1, 2, 4000, 5)
    lp[0, 0, 1200:1264] += 40.0
    lp[0, 1, 3950:] += 40.0
    check(top_k_filter, lp.log_softmax(-1), 64)


@pytest.mark.parametrize("capacity", [1, 70])
def test_filter_overflow_ranks_the_whole_row(capacity):
    lp = logprobs(1, 2, 1500, capacity)
    lp[0, 1] = (lp[0, 1] * 2).round() / 2  # ties too
    assert filter_plan(1500, 64, capacity=capacity).capacity == capacity
    check(top_k_filter, lp, 64, capacity=capacity)


@pytest.mark.parametrize("kw", [{"ratio": 2}, {"max_blocks": 16}, {"piece": 64}, {"ratio": 1, "max_blocks": 4}])
def test_filter_however_a_row_is_cut(kw):
    # More or fewer blocks and pieces (fewer blocks than k: no bound at all), the same answer.
    check(top_k_filter, logprobs(2, 2, 1000, 9, levels=8), 50, **kw)


def test_filter_plan_holds_what_a_row_can_need():
    for vocab, k in [(151936, 16), (151936, 64), (49152, 64), (16384, 32), (20, 20), (5, 3)]:
        p = filter_plan(vocab, k)
        assert p.bk >= k and p.bs * p.nbp * p.pieces >= vocab and p.mp >= p.pieces * p.nbp and p.mp <= 1024
        assert p.capacity >= min(vocab, p.pieces * k)  # k ties a program fit


def test_top_k_kernel_takes_the_filter_for_large_vocabularies(monkeypatch):
    calls = []
    for name in ("top_k_filter", "top_k_pieces"):
        monkeypatch.setattr(top_k_module, name, lambda lp, k, name=name: calls.append(name))
    top_k_kernel(torch.zeros(1, 1, FILTER_FROM_VOCAB), 4)
    top_k_kernel(torch.zeros(1, 1, FILTER_FROM_VOCAB - 1), 4)
    assert calls == ["top_k_filter", "top_k_pieces"]
