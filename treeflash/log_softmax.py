"""A draft's log-probabilities over a wide vocabulary, as two Triton kernels (CUDA).

`torch.log_softmax` over the last dimension gives each row one thread block: a Qwen3-8B draft block's
15 rows over 151,936 tokens ran as 15 blocks of a 132-SM H200 (~35 us a round, on top of a float32
copy of the logits: benchmarks/h200-draft-logprobs). Here each row is cut into CHUNK-token pieces,
each piece its own program: the first kernel takes every piece's maximum and sum of exponentials, the
second combines its row's into the log-sum-exp and writes its piece's log-probabilities in float32,
from logits in their own dtype, each row divided by its slot's temperature first. The result is
log_softmax(logits.float() / temperature) up to float32 rounding (the order of the sums differs); the
CPU keeps PyTorch's.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

CHUNK = 4096  # tokens a program takes


@triton.jit
def _chunk_stats(X, Temperature, Max, Sum, vocab, stride, rows_per_slot, num_chunks,
                 CHUNK: tl.constexpr, TEMPERED: tl.constexpr):
    row = tl.program_id(0)
    chunk = tl.program_id(1)
    cols = chunk * CHUNK + tl.arange(0, CHUNK)
    x = tl.load(X + row * stride + cols, mask=cols < vocab, other=float("-inf")).to(tl.float32)
    if TEMPERED:
        x = x / tl.load(Temperature + row // rows_per_slot)
    m = tl.max(x, 0)  # finite: every piece holds at least one token
    tl.store(Max + row * num_chunks + chunk, m)
    tl.store(Sum + row * num_chunks + chunk, tl.sum(tl.exp(x - m), 0))


@triton.jit
def _write(X, Temperature, Max, Sum, Out, vocab, stride, out_stride, rows_per_slot, num_chunks,
           CHUNK: tl.constexpr, CHUNKS_P2: tl.constexpr, TEMPERED: tl.constexpr):
    row = tl.program_id(0)
    chunk = tl.program_id(1)
    pieces = tl.arange(0, CHUNKS_P2)
    real = pieces < num_chunks
    m = tl.load(Max + row * num_chunks + pieces, mask=real, other=float("-inf"))
    m_all = tl.max(m, 0)
    lse = m_all + tl.log(tl.sum(tl.load(Sum + row * num_chunks + pieces, mask=real, other=0.0)
                                * tl.exp(m - m_all), 0))
    cols = chunk * CHUNK + tl.arange(0, CHUNK)
    ok = cols < vocab
    x = tl.load(X + row * stride + cols, mask=ok, other=0.0).to(tl.float32)
    if TEMPERED:
        x = x / tl.load(Temperature + row // rows_per_slot)
    tl.store(Out + row * out_stride + cols, x - lse, mask=ok)


def log_softmax_rows(logits: torch.Tensor, temperature: torch.Tensor | None = None) -> torch.Tensor:
    """logits [S, D, V] (any float dtype, unit stride along V) -> float32 log_softmax(logits / temperature)
    over V, temperature [S] float32 per slot (None: 1)."""
    slots, depths, vocab = logits.shape
    x = logits.reshape(slots * depths, vocab)
    if x.stride(1) != 1:
        x = x.contiguous()
    rows = x.shape[0]
    num_chunks = triton.cdiv(vocab, CHUNK)
    stats = torch.empty(2, rows, num_chunks, dtype=torch.float32, device=x.device)
    out = torch.empty(rows, vocab, dtype=torch.float32, device=x.device)
    tempered = temperature is not None
    temp = temperature if tempered else stats  # unused
    grid = (rows, num_chunks)
    _chunk_stats[grid](x, temp, stats[0], stats[1], vocab, x.stride(0), depths, num_chunks,
                       CHUNK=CHUNK, TEMPERED=tempered)
    _write[grid](x, temp, stats[0], stats[1], out, vocab, x.stride(0), out.stride(0), depths, num_chunks,
                 CHUNK=CHUNK, CHUNKS_P2=triton.next_power_of_2(num_chunks), TEMPERED=tempered)
    return out.view(slots, depths, vocab)
