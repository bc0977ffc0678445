"""The float64 block sums of the exact sampler as one Triton kernel (treeflash/block_sums.py), run by
Triton's interpreter on CPU tensors: the sums PyTorch's float64 reduction gives, and the same draws."""

from __future__ import annotations

import pytest
import torch

from triton_interpreter import mend  # noqa: F401  (first: it turns the interpreter on)
from treeflash import sampling
from treeflash.block_sums import block_sums
from treeflash.sampling import draw_uniforms, inverse_cdf

pytestmark = pytest.mark.usefixtures("mend")


@pytest.mark.parametrize("rows,vocab", [(3, 256), (2, 1000), (5, 4096 + 17), (1, 49152)])
def test_kernel_sums_are_pytorchs_float64_sums(rows, vocab):
    probs = torch.softmax(torch.randn(rows, vocab, generator=torch.Generator().manual_seed(vocab)) * 3, -1)
    probs[0, :vocab // 3] = 0.0  # empty blocks too
    want = sampling._block_sums_torch(probs, 256)  # PyTorch's sum(dtype=float64)
    got = block_sums(probs, 256)
    assert got.dtype == torch.float64 and got.shape == want.shape == (rows, -(-vocab // 256))
    torch.testing.assert_close(got, want, rtol=1e-15, atol=1e-300)


def test_draws_through_the_kernel_equal_the_cpu_paths(monkeypatch):
    gen = torch.Generator().manual_seed(1)
    probs = torch.softmax(torch.randn(64, 3000, generator=gen) * 4, -1)
    u = draw_uniforms(torch.randint(0, 1 << 32, (64, 2), generator=gen), torch.arange(64)[:, None].expand(64, 8))
    want = inverse_cdf(probs, u)
    monkeypatch.setattr(sampling, "_block_sums", lambda p, block: block_sums(p, block))
    assert torch.equal(inverse_cdf(probs, u), want)
