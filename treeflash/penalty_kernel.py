"""`penalties.penalize` as one Triton kernel (CUDA): one pass over a round's logits instead of about a dozen.

The torch ops build every node's counts as a [S, N, V] float tensor (the slot's output counts copied per
node, its drafted path added), then compare, divide, multiply and subtract over it, each a pass over S x N x V
floats: at the Qwen3-8B shape, eight slots of DDTree-64 (80M logits), penalties, a bias and min_tokens made a
graphed round 16% longer, and 30% at SmolLM2-135M's (benchmarks/gpu-sampling-fields/). Here one program per
node and 4,096 tokens reads the node's logits once, the slot's output counts and prompt row, and adds the
node's drafted path (at most one token per depth, found by walking its parents) where it stands.

The arithmetic is the torch ops', in their order and rounding: an IEEE division (`div_rn`, not the fast one)
and no fused multiply-adds (`enable_fp_fusion=False`), so the outputs are equal bit for bit (tests: through
Triton's interpreter on the CPU; scripts/gpu_check.py section L on the GPU). The torch ops stay the reference
and the CPU's path. On an H100 a DDTree-64 round with penalties, a bias and min_tokens then costs +7.7%
at the Qwen3-8B shape, batch 8 (+16.0% with the torch ops), and +14.6% at SmolLM2's (+30.7%;
benchmarks/gpu-sampling-kernels/).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

VOCAB_BLOCK = 4096


@triton.jit
def _penalize(Logits, Rep, Freq, Pres, Output, Prompt, Tokens, Parents, Out, sl_s, sl_n, so_s, sp_s, st_s, sa_s,
              N, V, DEPTH, HAS_OUTPUT: tl.constexpr, HAS_PATH: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    s, i = row // N, row % N
    v = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    real = v < V
    x = tl.load(Logits + s * sl_s + i * sl_n + v, mask=real, other=0).to(tl.float32)
    if HAS_OUTPUT:
        counts = tl.load(Output + s * so_s + v, mask=real, other=0).to(tl.float32)
    else:
        counts = tl.zeros([BLOCK], dtype=tl.float32)
    if HAS_PATH:
        node = i
        for _ in range(DEPTH):  # (up the node's drafted path; the root, already counted, ends it)
            if node != 0:
                token = tl.load(Tokens + s * st_s + node)
                counts += tl.where(v == token, 1.0, 0.0)
                node = tl.load(Parents + s * sa_s + node)
    seen = (counts > 0) | (tl.load(Prompt + s * sp_s + v, mask=real, other=0) != 0)
    r = tl.load(Rep + s)
    x = tl.where(seen, tl.where(x > 0, tl.math.div_rn(x, r), x * r), x)
    x = x - tl.load(Freq + s) * counts
    x = x - tl.load(Pres + s) * (counts > 0).to(tl.float32)
    tl.store(Out + row * V + v, x, mask=real)


def penalize_kernel(logits: torch.Tensor, repetition: torch.Tensor, frequency: torch.Tensor, presence: torch.Tensor,
                    output: torch.Tensor | None, prompt: torch.Tensor, tokens: torch.Tensor | None = None,
                    parents: torch.Tensor | None = None, depth: int = 0) -> torch.Tensor:
    """`penalize`'s float32 logits [S, N, V]; the path from tokens and parents [S, N] (a tree's), depth its
    deepest node's (host int)."""
    if logits.stride(-1) != 1:
        logits = logits.contiguous()
    s, n, v = logits.shape
    out = torch.empty(s, n, v, dtype=torch.float32, device=logits.device)
    path = tokens is not None and n > 1 and depth > 0
    for t in (output, prompt):
        assert t is None or t.stride(-1) == 1, "vocabulary rows must be contiguous"
    prompt = prompt.view(torch.int8) if prompt.dtype == torch.bool else prompt
    _penalize[(s * n, triton.cdiv(v, VOCAB_BLOCK))](
        logits, repetition.float(), frequency.float(), presence.float(), output if output is not None else prompt,
        prompt, tokens if path else prompt, parents if path else prompt, out, logits.stride(0), logits.stride(1),
        output.stride(0) if output is not None else 0, prompt.stride(0), tokens.stride(0) if path else 0,
        parents.stride(0) if path else 0, n, v, depth, HAS_OUTPUT=output is not None, HAS_PATH=path,
        BLOCK=VOCAB_BLOCK, num_warps=4, enable_fp_fusion=False)
    return out
