"""The draft's log-softmax as two Triton kernels (treeflash/log_softmax.py), run by Triton's interpreter on CPU
tensors: PyTorch's log_softmax of the tempered logits up to float32 rounding, whatever the row's length against
the kernels' pieces, with and without temperatures, from a strided view too."""

from __future__ import annotations

import pytest
import torch

from triton_interpreter import mend  # noqa: F401  (first: it turns the interpreter on)
from treeflash.log_softmax import CHUNK, log_softmax_rows
from treeflash.round import draft_log_probs

pytestmark = pytest.mark.usefixtures("mend")


@pytest.mark.parametrize("slots,depths,vocab", [(1, 3, 100), (2, 5, CHUNK), (3, 2, 2 * CHUNK + 17), (1, 15, 49152)])
@pytest.mark.parametrize("tempered", [False, True])
def test_kernels_give_pytorchs_log_softmax(slots, depths, vocab, tempered):
    gen = torch.Generator().manual_seed(vocab + depths)
    logits = torch.randn(slots, depths, vocab, generator=gen) * 6
    logits[0, 0, :vocab // 2] -= 80  # a row whose mass sits in its last pieces
    temperature = torch.rand(slots, generator=gen) * 1.5 + 0.2 if tempered else None
    want = torch.log_softmax(logits / temperature[:, None, None] if tempered else logits, -1)
    got = log_softmax_rows(logits, temperature)
    assert got.dtype == torch.float32 and got.shape == want.shape
    torch.testing.assert_close(got, want, rtol=1e-5, atol=2e-5)
    assert torch.equal(got.argmax(-1), want.argmax(-1))


def test_a_strided_view_and_the_cpu_dispatch():
    logits = torch.randn(2, 4, 2 * 300, generator=torch.Generator().manual_seed(0))[..., ::2]  # stride 2 along V
    temperature = torch.tensor([0.7, 1.3])
    torch.testing.assert_close(log_softmax_rows(logits, temperature), draft_log_probs(logits, temperature))
    torch.testing.assert_close(draft_log_probs(logits.bfloat16(), None), torch.log_softmax(logits.bfloat16().float(), -1))
