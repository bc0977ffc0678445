"""Reductions along vocabulary-wide rows as Triton kernels (treeflash/vocab_rows.py), run by Triton's interpreter
on CPU tensors: the draft's log-softmax is PyTorch's of the tempered logits up to float32 rounding, and the row
maxima are `torch.max`'s, first index among ties, whatever the row's length against the kernels' pieces."""

from __future__ import annotations

import pytest
import torch

from triton_interpreter import mend  # noqa: F401  (first: it turns the interpreter on)
from treeflash.round import draft_log_probs
from treeflash.sampling import vocab_max
from treeflash.vocab_rows import CHUNK, log_softmax_rows, max_rows

pytestmark = pytest.mark.usefixtures("mend")
SHAPES = [(1, 3, 100), (2, 5, CHUNK), (3, 2, 2 * CHUNK + 17), (1, 15, 49152)]


@pytest.mark.parametrize("slots,depths,vocab", SHAPES)
@pytest.mark.parametrize("tempered", [False, True])
def test_log_softmax_is_pytorchs(slots, depths, vocab, tempered):
    gen = torch.Generator().manual_seed(vocab + depths)
    logits = torch.randn(slots, depths, vocab, generator=gen) * 6
    logits[0, 0, :vocab // 2] -= 80  # a row whose mass sits in its last pieces
    temperature = torch.rand(slots, generator=gen) * 1.5 + 0.2 if tempered else None
    want = torch.log_softmax(logits / temperature[:, None, None] if tempered else logits, -1)
    got = log_softmax_rows(logits, temperature)
    assert got.dtype == torch.float32 and got.shape == want.shape
    torch.testing.assert_close(got, want, rtol=1e-5, atol=2e-5)
    assert torch.equal(got.argmax(-1), want.argmax(-1))


def test_log_softmax_of_a_strided_view_and_the_cpu_dispatch():
    logits = torch.randn(2, 4, 2 * 300, generator=torch.Generator().manual_seed(0))[..., ::2]  # stride 2 along V
    temperature = torch.tensor([0.7, 1.3])
    torch.testing.assert_close(log_softmax_rows(logits, temperature), draft_log_probs(logits, temperature))
    half = logits.bfloat16()
    torch.testing.assert_close(draft_log_probs(half, None), torch.log_softmax(half.float(), -1))


@pytest.mark.parametrize("slots,depths,vocab", SHAPES)
def test_max_rows_is_torch_max_first_index_among_ties(slots, depths, vocab):
    gen = torch.Generator().manual_seed(vocab)
    x = (torch.randn(slots, depths, vocab, generator=gen) * 4).round()  # few distinct values: ties everywhere
    x[0, 0, -1] = 100.0  # the last token of the last piece
    x[-1, -1] = -torch.inf  # a row of -inf: index 0
    if depths > 1:
        x[0, 1, [7, vocab - 3]] = 50.0  # a tie across pieces: the first
    best, index = max_rows(x)
    want_best, want_index = x.max(dim=-1)
    assert index.dtype == torch.long and best.dtype == torch.float32
    assert torch.equal(best, want_best) and torch.equal(index, want_index)
    assert torch.equal(max_rows(x.bfloat16())[1], x.bfloat16().argmax(-1))  # loads of bf16 rows are exact
    assert torch.equal(vocab_max(x)[1], x.argmax(-1))  # the CPU's dispatch
