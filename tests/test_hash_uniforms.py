"""The sampler's uniforms as one Triton kernel (treeflash/hash_uniforms.py), run by Triton's interpreter on
CPU tensors: bit for bit the uniforms of the PyTorch path, so a seeded request gets the same uniforms on CUDA."""

from __future__ import annotations

import pytest
import torch

from triton_interpreter import mend  # noqa: F401  (first: it turns the interpreter on)
from treeflash import sampling
from treeflash.hash_uniforms import hash_uniforms

pytestmark = pytest.mark.usefixtures("mend")


@pytest.mark.parametrize("slots,nodes", [(1, 1), (3, 65), (2, 300)])
def test_kernel_uniforms_are_the_pytorch_ones_bit_for_bit(slots, nodes):
    gen = torch.Generator().manual_seed(slots * 1000 + nodes)
    seed = torch.randint(0, 1 << 32, (slots, 2), generator=gen)
    seed[0] = torch.tensor([0xFFFFFFFF, 0])  # the extremes of both halves
    positions = torch.randint(0, 1 << 40, (slots, nodes), generator=gen)  # past 2^32: only the low bits count
    assert positions.is_cuda is False  # the dispatch in draw_uniforms is CUDA-only: call the PyTorch path
    want = sampling.draw_uniforms(seed, positions)
    got = hash_uniforms(seed, positions)
    assert got.dtype == torch.float64 and got.shape == want.shape
    assert torch.equal(got, want)


def test_kernel_takes_strided_positions_and_seed_rows():
    seed = torch.randint(0, 1 << 32, (4, 2), generator=torch.Generator().manual_seed(7))
    positions = torch.arange(4)[:, None].expand(4, 9) + 1000  # a slot's nodes of one depth share a position
    assert torch.equal(hash_uniforms(seed[:2], positions[:2]), sampling.draw_uniforms(seed[:2], positions[:2]))
    assert torch.equal(hash_uniforms(seed, positions), sampling.draw_uniforms(seed, positions))
