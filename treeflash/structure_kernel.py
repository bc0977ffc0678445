"""`GrammarSlots`' device work as Triton kernels (CUDA): a few launches a round instead of ~650.

A structured request's round steps its automaton at every depth: the tree's nodes' states (one binary search
per node and depth), the drafts' masks along their most likely allowed chain (a mask, an argmax and a step
per depth), the slot's state after the emitted tokens (a step per token). As torch ops each step is a dozen
small kernels, and a DDTree-64 round held ~650 of them: +1.1 ms a round on an H100 at both the SmolLM2-135M
and the Qwen3-8B shape, +81% of the small model's round (benchmarks/gpu-sampling-fields/). Here:

- `tree_states`: one program per slot, the tree's nodes in registers, one pass per depth (a gather of the
  parents' states and a vectorised binary search), as `GrammarSlots.apply`'s loop;
- `masked_logits`: one program per (node, block of the vocabulary) reads the state's bit row;
- `drafts_masked`: one launch per depth, each program a block of the draft vocabulary; a depth's programs
  first reduce the depth above's per-block maxima to its most likely allowed draft and step to its state
  (each program the same, so no program waits for another), and one last launch gives a depth whose allowed
  tokens all lie outside the draft vocabulary the drafter's own logits back;
- `follow`: one program steps every slot through the tokens its round emitted.

With every slot structured, a graphed DDTree-64 round then costs +8.5-8.9% at the SmolLM2-135M shape and
+1.1-2.7% at Qwen3-8B's (H100, batch 1 and 8; benchmarks/gpu-sampling-kernels/).

The outputs are the torch ops', element for element (tests: through Triton's interpreter on the CPU;
scripts/gpu_check.py section S on the GPU). The torch ops stay the reference and the CPU's path
(`GrammarSlots.kernels`).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

VOCAB_BLOCK = 4096  # vocabulary entries a program masks


@triton.jit
def _step(Keys, Next, n_keys, state, token, V, ITERS):
    """The state `token` leads to from `state` (tensors of one shape), 0 where it is not allowed:
    `GrammarSlots.step`, a lower-bound binary search over the sorted keys (n_keys of them, the last a
    sentinel no query equals)."""
    query = state * V + token
    lo = tl.zeros_like(query)
    hi = lo + n_keys
    for _ in range(ITERS):
        active = lo < hi
        mid = (lo + hi) // 2
        key = tl.load(Keys + mid, mask=active, other=0)
        less = key < query
        lo, hi = tl.where(active & less, mid + 1, lo), tl.where(active & ~less, mid, hi)
    at = tl.minimum(lo, n_keys - 1)
    return tl.where(tl.load(Keys + at) == query, tl.load(Next + at), 0)


@triton.jit
def _tree_states(Root, Tokens, Parents, Depths, Out, Keys, Next, n_keys, V, st_s, sp_s, sd_s, N, PASSES, ITERS,
                 BLOCK: tl.constexpr):
    s = tl.program_id(0).to(tl.int64)
    n = tl.arange(0, BLOCK)
    real = n < N
    root = tl.load(Root + s)
    parent = tl.load(Parents + s * sp_s + n, mask=real, other=0).to(tl.int32)
    token = tl.load(Tokens + s * st_s + n, mask=real, other=0).to(tl.int64)
    top = tl.load(Depths + s * sd_s + n, mask=real, other=0) == 0
    state = tl.zeros([BLOCK], dtype=tl.int64) + root
    for _ in range(PASSES):  # (parents precede children: depth d is right after d passes)
        state = tl.where(top, root, _step(Keys, Next, n_keys, tl.gather(state, parent, 0), token, V, ITERS))
    tl.store(Out + s * N + n, state, mask=real)


@triton.jit
def _masked_logits(Logits, States, Allowed, Out, sl_s, sl_n, ss_s, ss_n, sa, N, V, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    s, i = row // N, row % N
    v = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    real = v < V
    state = tl.load(States + s * ss_s + i * ss_n)
    bits = tl.load(Allowed + state * sa + v // 8, mask=real, other=0)
    x = tl.load(Logits + s * sl_s + i * sl_n + v, mask=real, other=0).to(tl.float32)
    ok = ((bits >> (v % 8).to(tl.uint8)) & 1) != 0
    tl.store(Out + row * V + v, tl.where(ok, x, float("-inf")), mask=real)


@triton.jit
def _best(Best, Where, base, C, CB: tl.constexpr):
    """The first index of the largest of C per-block (max, first index of it) pairs at base."""
    c = tl.arange(0, CB)
    best = tl.load(Best + base + c, mask=c < C, other=float("-inf"))
    where = tl.load(Where + base + c, mask=c < C, other=2147483647)
    top = tl.max(best, 0)
    return top, tl.min(tl.where(best == top, where, 2147483647), 0)


@triton.jit
def _draft_depth(Logits, Out, Columns, State0, States, Allowed, Keys, Next, MBest, MWhere, RBest, RWhere,
                 n_keys, V, VD, D, d, C, sl_s, sl_d, sa, ITERS, HAS_COLUMNS: tl.constexpr, BLOCK: tl.constexpr,
                 CB: tl.constexpr):
    s = tl.program_id(0).to(tl.int64)
    c = tl.program_id(1)
    if d == 0:
        state = tl.load(State0 + s)
    else:
        # The depth above's most likely allowed draft (its drafter's own where none is allowed), and its state.
        base = (s * D + d - 1) * C
        top, token = _best(MBest, MWhere, base, C, CB)
        if top == float("-inf"):
            top, token = _best(RBest, RWhere, base, C, CB)
        if HAS_COLUMNS:
            token = tl.load(Columns + token)
        state = _step(Keys, Next, n_keys, tl.load(States + s * D + d - 1), token.to(tl.int64), V, ITERS)
        if c == 0:
            tl.store(States + s * D + d, state)
    v = c * BLOCK + tl.arange(0, BLOCK)
    real = v < VD
    x = tl.load(Logits + s * sl_s + d * sl_d + v, mask=real, other=float("-inf")).to(tl.float32)
    if HAS_COLUMNS:
        t = tl.load(Columns + v, mask=real, other=0)
    else:
        t = v
    bits = tl.load(Allowed + state * sa + t // 8, mask=real, other=0)
    ok = ((bits >> (t % 8).to(tl.uint8)) & 1) != 0
    masked = tl.where(ok & real, x, float("-inf"))
    tl.store(Out + (s * D + d) * VD + v, masked, mask=real)
    at = (s * D + d) * C + c
    tl.store(MBest + at, tl.max(masked, 0))
    tl.store(MWhere + at, (c * BLOCK + tl.argmax(masked, 0)).to(tl.int32))
    tl.store(RBest + at, tl.max(x, 0))
    tl.store(RWhere + at, (c * BLOCK + tl.argmax(x, 0)).to(tl.int32))
    if d == 0:
        if c == 0:
            tl.store(States + s * D, state)


@triton.jit
def _drafts_fallback(Logits, Out, MBest, MWhere, VD, D, C, sl_s, sl_d, BLOCK: tl.constexpr, CB: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    s, d = row // D, row % D
    top, _ = _best(MBest, MWhere, row * C, C, CB)
    if top == float("-inf"):
        v = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        real = v < VD
        x = tl.load(Logits + s * sl_s + d * sl_d + v, mask=real, other=0).to(tl.float32)
        tl.store(Out + row * VD + v, x, mask=real)


@triton.jit
def _follow(State, Emitted, Accepted, Keys, Next, n_keys, V, se_s, S, K, ITERS, BLOCK: tl.constexpr):
    slot = tl.arange(0, BLOCK)
    real = slot < S
    state = tl.load(State + slot, mask=real, other=0)
    accepted = tl.load(Accepted + slot, mask=real, other=0)
    for k in range(0, tl.minimum(tl.max(accepted, 0), K)):  # (no slot takes a step past the longest)
        go = real & (k < accepted)
        token = tl.load(Emitted + slot * se_s + k, mask=go, other=0).to(tl.int64)
        state = tl.where(go, _step(Keys, Next, n_keys, state, token, V, ITERS), state)
    tl.store(State + slot, state, mask=real)


def _iters(keys: torch.Tensor) -> int:
    # A lower bound over n keys settles within bit_length(n) halvings.
    return keys.numel().bit_length()


def tree_states(root: torch.Tensor, tree, keys: torch.Tensor, next_: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Each node's state [S, N] (int64): its drafted path's steps from `root` [S] (`GrammarSlots.apply`'s)."""
    slots, n = tree.tokens.shape
    for t in (tree.tokens, tree.parents, tree.depths):
        assert n == 1 or t.stride(1) == 1, "node rows must be contiguous"
    out = torch.empty(slots, n, dtype=torch.long, device=root.device)
    block = max(16, triton.next_power_of_2(n))
    _tree_states[(slots,)](root.contiguous(), tree.tokens, tree.parents, tree.depths, out, keys, next_, keys.numel(),
                           vocab_size, tree.tokens.stride(0), tree.parents.stride(0), tree.depths.stride(0), n,
                           tree.max_depth, _iters(keys), BLOCK=block, num_warps=4 if block <= 1024 else 8)
    return out


def masked_logits(logits: torch.Tensor, states: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
    """logits [S, N, V] as float32, -inf where each node's state [S, N] (any strides) forbids the token."""
    if logits.stride(-1) != 1:
        logits = logits.contiguous()
    s, n, v = logits.shape
    out = torch.empty(s, n, v, dtype=torch.float32, device=logits.device)
    _masked_logits[(s * n, triton.cdiv(v, VOCAB_BLOCK))](logits, states, allowed, out, logits.stride(0),
                                                         logits.stride(1), states.stride(0), states.stride(1),
                                                         allowed.stride(0), n, v, BLOCK=VOCAB_BLOCK, num_warps=4)
    return out


def drafts_masked(logits: torch.Tensor, state: torch.Tensor, allowed: torch.Tensor, keys: torch.Tensor,
                  next_: torch.Tensor, vocab_size: int, columns: torch.Tensor | None) -> torch.Tensor:
    """`GrammarSlots.apply_drafts`: logits [S, D, V'] (float32 out) from the slots' states [S]."""
    if logits.stride(-1) != 1:
        logits = logits.contiguous()
    s, depths, vd = logits.shape
    dev = logits.device
    chunks = triton.cdiv(vd, VOCAB_BLOCK)
    cb = max(2, triton.next_power_of_2(chunks))
    out = torch.empty(s, depths, vd, dtype=torch.float32, device=dev)
    states = torch.empty(s, depths, dtype=torch.long, device=dev)
    mbest, rbest = (torch.empty(s, depths, chunks, dtype=torch.float32, device=dev) for _ in range(2))
    mwhere, rwhere = (torch.empty(s, depths, chunks, dtype=torch.int32, device=dev) for _ in range(2))
    state = state.contiguous()
    cols = columns if columns is not None else state  # (a pointer never read without columns)
    for d in range(depths):
        _draft_depth[(s, chunks)](logits, out, cols, state, states, allowed, keys, next_, mbest, mwhere,
                                  rbest, rwhere, keys.numel(), vocab_size, vd, depths, d, chunks, logits.stride(0),
                                  logits.stride(1), allowed.stride(0), _iters(keys), HAS_COLUMNS=columns is not None,
                                  BLOCK=VOCAB_BLOCK, CB=cb, num_warps=4)
    _drafts_fallback[(s * depths, chunks)](logits, out, mbest, mwhere, vd, depths, chunks, logits.stride(0),
                                           logits.stride(1), BLOCK=VOCAB_BLOCK, CB=cb, num_warps=4)
    return out


def follow(state: torch.Tensor, emitted: torch.Tensor, accepted: torch.Tensor, keys: torch.Tensor,
           next_: torch.Tensor, vocab_size: int) -> None:
    """`GrammarSlots.add`: state[:S] (in place) after emitted[s, :accepted[s]] for slots [0, S)."""
    s, k = emitted.shape
    assert k <= 1 or emitted.stride(1) == 1, "emitted rows must be contiguous"
    block = max(16, triton.next_power_of_2(s))
    _follow[(1,)](state, emitted, accepted, keys, next_, keys.numel(), vocab_size, emitted.stride(0), s, k,
                  _iters(keys), BLOCK=block, num_warps=4)
