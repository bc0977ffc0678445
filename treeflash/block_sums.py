"""float64 sums of fixed-size blocks of float32 probabilities, as one Triton kernel (CUDA).

`sampling.inverse_cdf` draws from float64 block sums. In PyTorch `probs.sum(-1, dtype=torch.float64)`
first copies every float32 probability to float64 (it spares that only for half/bf16 -> float32 on
CUDA): at batch 32 and budget 64 over a 49k vocabulary, ~0.8 GB written and read again per round.
This kernel reads each float32 value once and adds it in float64. Its order of addition is not
PyTorch's, so a sum may differ in the last bit (both are float64 sums of the same values, exact to
~1e-16 relative); graphed and eager rounds, and plain and speculative decoding, all run this same
kernel on CUDA. The CPU keeps the PyTorch path.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

_BLOCKS_PER_PROGRAM = 16


@triton.jit
def _sums(P, Out, vocab, stride, num_blocks, BLOCK: tl.constexpr, GROUP: tl.constexpr):
    row = tl.program_id(0)
    first = tl.program_id(1) * GROUP
    blocks = first + tl.arange(0, GROUP)
    cols = blocks[:, None] * BLOCK + tl.arange(0, BLOCK)[None, :]
    x = tl.load(P + row * stride + cols, mask=cols < vocab, other=0.0)
    tl.store(Out + row * num_blocks + blocks, tl.sum(x.to(tl.float64), axis=1), mask=blocks < num_blocks)


def block_sums(probs: torch.Tensor, block: int) -> torch.Tensor:
    """probs [R, V] float32 (unit stride along V) -> [R, ceil(V / block)] float64 sums of consecutive
    `block`-token blocks (the last one ragged). `block` must be a power of two."""
    rows, vocab = probs.shape
    num_blocks = triton.cdiv(vocab, block)
    out = torch.empty(rows, num_blocks, dtype=torch.float64, device=probs.device)
    grid = (rows, triton.cdiv(num_blocks, _BLOCKS_PER_PROGRAM))
    _sums[grid](probs, out, vocab, probs.stride(0), num_blocks, BLOCK=block, GROUP=_BLOCKS_PER_PROGRAM)
    return out
