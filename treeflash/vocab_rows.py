"""Reductions along vocabulary-wide rows, each row spread over many programs (Triton, CUDA).

PyTorch reduces a row of logits in one thread block, or a few: a round's rows are few (15 draft
depths, 65 tree nodes) and long (151,936 tokens for Qwen3), so most of a 132-SM H200 sat idle. Here
every row is cut into CHUNK-token pieces, a program each, and a second launch combines a row's pieces.

- `log_softmax_rows`: the draft's log-probabilities. The first kernel takes each piece's maximum and
  sum of exponentials, the second the row's log-sum-exp and its piece's float32 log-probs, from logits
  in their own dtype, each row divided by its slot's temperature first: log_softmax(logits.float() /
  temperature) up to float32 rounding (the order of the sums differs). A row may hold -inf (a request's
  allowed tokens or banned ones), even whole pieces of it, as long as one token is finite. torch's float32 copy and
  log_softmax took 41.8 us at one slot (15 rows), this 8.0 (benchmarks/h200-draft-logprobs).
- `max_rows`: each row's maximum and the index of its first occurrence, as `torch.max(dim=-1)` gives
  them (finite values; greedy's argmax over the target's logits, the DFlash chain's best drafts).

The CPU keeps PyTorch's (the callers dispatch: `round.draft_log_probs`, `sampling.vocab_max`).
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
    m = tl.max(x, 0)  # -inf only where every token of the piece is masked (a row keeps at least one)
    tl.store(Max + row * num_chunks + chunk, m)
    tl.store(Sum + row * num_chunks + chunk, tl.sum(tl.exp(x - tl.where(m == float("-inf"), 0.0, m)), 0))


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


@triton.jit
def _chunk_max(X, Max, Index, vocab, stride, num_chunks, CHUNK: tl.constexpr):
    row = tl.program_id(0)
    chunk = tl.program_id(1)
    cols = chunk * CHUNK + tl.arange(0, CHUNK)
    x = tl.load(X + row * stride + cols, mask=cols < vocab, other=float("-inf")).to(tl.float32)
    m, i = tl.max(x, 0, return_indices=True, return_indices_tie_break_left=True)
    tl.store(Max + row * num_chunks + chunk, m)
    tl.store(Index + row * num_chunks + chunk, chunk * CHUNK + i)


@triton.jit
def _row_max(Max, Index, OutMax, OutIndex, num_chunks, CHUNKS_P2: tl.constexpr):
    row = tl.program_id(0)
    pieces = tl.arange(0, CHUNKS_P2)
    m = tl.load(Max + row * num_chunks + pieces, mask=pieces < num_chunks, other=float("-inf"))
    best, piece = tl.max(m, 0, return_indices=True, return_indices_tie_break_left=True)  # the first piece
    tl.store(OutMax + row, best)
    tl.store(OutIndex + row, tl.load(Index + row * num_chunks + piece).to(tl.int64))


def _rows(x: torch.Tensor) -> torch.Tensor:
    rows = x.reshape(-1, x.shape[-1])
    return rows if rows.stride(1) == 1 else rows.contiguous()


def log_softmax_rows(logits: torch.Tensor, temperature: torch.Tensor | None = None) -> torch.Tensor:
    """logits [S, D, V] (any float dtype) -> float32 log_softmax(logits / temperature) over V, temperature [S]
    float32 per slot (None: 1)."""
    slots, depths, vocab = logits.shape
    x = _rows(logits)
    rows, num_chunks = x.shape[0], triton.cdiv(vocab, CHUNK)
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


def max_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [..., V] (any float dtype, finite) -> (float32 maxima, int64 index of each row's first maximum) [...],
    as `x.float().max(dim=-1)`."""
    rows = _rows(x)
    count, vocab = rows.shape
    num_chunks = triton.cdiv(vocab, CHUNK)
    chunk_max = torch.empty(count, num_chunks, dtype=torch.float32, device=x.device)
    chunk_index = torch.empty(count, num_chunks, dtype=torch.int32, device=x.device)
    best = torch.empty(count, dtype=torch.float32, device=x.device)
    index = torch.empty(count, dtype=torch.int64, device=x.device)
    _chunk_max[(count, num_chunks)](rows, chunk_max, chunk_index, vocab, rows.stride(0), num_chunks, CHUNK=CHUNK)
    _row_max[(count,)](chunk_max, chunk_index, best, index, num_chunks,
                       CHUNKS_P2=triton.next_power_of_2(num_chunks))
    return best.view(x.shape[:-1]), index.view(x.shape[:-1])
