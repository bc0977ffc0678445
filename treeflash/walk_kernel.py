"""`tree.walk` and `tree.ancestor_mask` as Triton kernels (CUDA): one launch each instead of ~24 and ~14.

Both follow each node's parents up to the root. The torch functions do it by pointer doubling over the
whole batch, a gather and a logical op per pass and a few more for the path: on a GPU each op is a
kernel that costs more than its work, and a small model's round is made of such launches (SmolLM2-135M,
DDTree-64, batch 1, on an H100: the walk's ~24 kernels and the mask's ~14 took ~70 us of the round's
1.35 ms of kernels; with these kernels an H200's round took 1.388 ms instead of 1.458, the AR step
0.944-0.949 instead of 0.968: benchmarks/h200-walk-kernel/). Here one program per slot walks (the tree's
nodes in registers, pointer doubling by register gathers), and one program per (slot, block of rows)
writes the mask (each row's ancestors, one parent step at a time, from the slot's parents in registers).

The outputs are the torch functions', element for element (tests: through Triton's interpreter on the
CPU; scripts/gpu_check.py section T on the GPU). The torch functions stay the reference and the CPU's
path (`round.use_path_kernels` decides; `LLM(tree_kernel=False)` turns them off with the tree builder).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from treeflash.tree import DraftTree, Walk, _doubling_passes

# The mask kernel's tile: ROWS x next_power_of_2(N) booleans a program, ROWS at most MASK_ROWS.
MASK_ROWS = 16
MASK_TILE = 4096


@triton.jit
def _walk(Tokens, Parents, Depths, Valid, Derived, Path, Accepted, Emitted,
          st_s, sp_s, sd_s, sv_s, sx_s, N, DEPTHS, PASSES, BLOCK: tl.constexpr):
    s = tl.program_id(0).to(tl.int64)
    n = tl.arange(0, BLOCK)
    real = n < N
    parent = tl.load(Parents + s * sp_s + n, mask=real, other=0).to(tl.int32)
    token = tl.load(Tokens + s * st_s + n, mask=real, other=-1)
    valid = tl.load(Valid + s * sv_s + n, mask=real, other=0) != 0
    # The target's token at each node's parent: a node matches when it is that token.
    at_parent = tl.load(Derived + s * sx_s + parent, mask=real, other=-2)
    ok = (valid & (token == at_parent) & real) | (n == 0)
    ok = ok.to(tl.int32)
    # A node is accepted iff it and every ancestor match: pointer doubling (the root is its own parent).
    up = parent
    for _ in range(PASSES):
        ok = ok & tl.gather(ok, up, 0)
        up = tl.gather(up, up, 0)
    depth = tl.load(Depths + s * sd_s + n, mask=real, other=-1)
    tl.store(Accepted + s, tl.sum(ok, 0).to(tl.int64))
    # The accepted node at each depth (one at most: siblings are distinct), else 0, as `walk`'s argmax.
    for d in range(0, DEPTHS + 1):
        node = tl.min(tl.where((ok != 0) & (depth == d), n, BLOCK), 0)
        node = tl.where(node == BLOCK, 0, node).to(tl.int64)
        tl.store(Path + s * (DEPTHS + 1) + d, node)
        tl.store(Emitted + s * (DEPTHS + 1) + d, tl.load(Derived + s * sx_s + node))


@triton.jit
def _ancestors(Parents, Out, sp_s, N, DEPTHS, ROWS: tl.constexpr, BLOCK: tl.constexpr):
    s = tl.program_id(0).to(tl.int64)
    i = tl.program_id(1) * ROWS + tl.arange(0, ROWS)
    j = tl.arange(0, BLOCK)
    parent = tl.load(Parents + s * sp_s + j, mask=j < N, other=0).to(tl.int32)
    at = tl.minimum(i, N - 1)
    seen = j[None, :] == at[:, None]
    # Up one parent per step: DEPTHS steps reach the root from the deepest node (the root is its own parent).
    for _ in range(DEPTHS):
        at = tl.gather(parent, at, 0)
        seen = seen | (j[None, :] == at[:, None])
    tl.store(Out + s * N * N + i[:, None].to(tl.int64) * N + j[None, :], seen,
             mask=(i[:, None] < N) & (j[None, :] < N))


def walk_kernel(tree: DraftTree, derived: torch.Tensor) -> Walk:
    """`walk(tree, derived)` in one launch. derived: [S, N] the target's token at each node."""
    slots, n = tree.tokens.shape
    depths = tree.max_depth
    dev = derived.device
    path = torch.empty(slots, depths + 1, dtype=torch.long, device=dev)
    emitted = torch.empty(slots, depths + 1, dtype=derived.dtype, device=dev)
    accepted = torch.empty(slots, dtype=torch.long, device=dev)
    fields = [tree.tokens, tree.parents, tree.depths, tree.valid, derived]
    for t in fields:
        assert t.shape == (slots, n) and (n == 1 or t.stride(1) == 1), "node rows must be contiguous"
    block = max(16, triton.next_power_of_2(n))
    _walk[(slots,)](tree.tokens, tree.parents, tree.depths, tree.valid.view(torch.int8), derived,
                    path, accepted, emitted, *(t.stride(0) for t in fields), n, depths,
                    _doubling_passes(depths), BLOCK=block, num_warps=4 if block <= 1024 else 8)
    return Walk(path=path, accepted=accepted, emitted=emitted)


def ancestor_mask_kernel(tree: DraftTree) -> torch.Tensor:
    """`ancestor_mask(tree)` ([S, N, N] bool: node i sees node j iff j is i or an ancestor of i)."""
    slots, n = tree.parents.shape
    assert n == 1 or tree.parents.stride(1) == 1, "node rows must be contiguous"
    out = torch.empty(slots, n, n, dtype=torch.bool, device=tree.parents.device)
    block = max(16, triton.next_power_of_2(n))
    rows = max(1, min(MASK_ROWS, MASK_TILE // block))
    _ancestors[(slots, triton.cdiv(n, rows))](tree.parents, out.view(torch.int8), tree.parents.stride(0), n,
                                              tree.max_depth, ROWS=rows, BLOCK=block, num_warps=4)
    return out
