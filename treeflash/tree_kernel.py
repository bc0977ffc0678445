"""`build_tree` as Triton kernels (CUDA): the same tree, from three launches a round instead of ~120.

On a GPU the tree stage of a round is launch-bound: `tree.build_tree` is ~85 small torch ops (a beam
step per depth: add, index, sort), each a kernel or more that costs more than its work. Here one
program per slot runs the whole builder in registers and a small scratch area: per depth the pruned
(beam entry, child) pairs (`tree._beam_pairs`) are ranked by one bitonic top-k of packed 64-bit keys
(the score's order-preserving bits, then the pair's position reversed, so that equal scores keep the
stable sort's order), with the beam kept in registers between depths (gathers, no round trip through
memory and no barrier per depth), then the global choice among all depths by one sort of such keys,
then parents by lookup. Before it, `top_k.top_k_kernel` takes each (slot, depth) row's best tokens,
reading the draft log-probs in their own dtype (torch's `lp.float().topk`, ~76-100 us of a ~100-160 us
build on the H200, copies them to float32 and ranks ties its own way).
The result is `build_tree`'s, field for field (tests: through Triton's interpreter on the CPU), except
where log-probs tie at the edge of a depth's top-k: there the kernel keeps the lower token, and
`build_tree` (torch.topk) whichever its top-k returns; both are DDTree's tree for those log-probs, and
which one a round drafts changes only what it may accept.
`build_tree` stays the reference and the CPU path. On CUDA this kernel is the default for trees of at
most 4096 candidates (next_power_of_2(depths * budget): budget <= 256 at 15 depths; `round.use_tree_kernel`,
`LLM(tree_kernel=True/False)` forces it on/off). Measured on an H200 (SmolLM2-135M shape, random
bf16 weights, context 1024, CUDA graphs, splitkv; benchmarks/h200-treekernel/), median ms per round, torch
ops vs the first kernel (a full sort per depth): batch 1 ddtree:16 2.109 vs 1.802, ddtree:64 2.338 vs
1.955, ddtree:256 2.948 vs 3.048 (slower: the torch ops stayed there until the kernel of today measured
faster, benchmarks/h200-treekernel-256/: 2.128 vs 2.377 ms); batch 8 ddtree:64 3.534 vs 3.125.
This kernel against that one (benchmarks/h200-kernels-topk-blocksums/, `benchmarks/tree_kernel_ab.py`,
15 depths, top-k + kernel per build): budget 64 136 vs 154 us, 16 and 32 1-2 us less (the top-k of the
log-probs, ~76 us, is most of a build there). With `top_k_kernel` instead of torch's top-k
(benchmarks/h200-topk-kernel/): one slot, bf16 log-probs, budgets 16 / 32 / 64: 31.9 / 42.5 / 85.8 us
against 117.8 / 122.1 / 161.5; 8 slots 1.04-1.5x faster; the SmolLM2 rounds' tree stage 0.13 -> 0.06 ms
(budget 32), 0.17 -> 0.11 (64). Its warps per size: `build_warps`.
`scripts/gpu_check.py` checks it field for field at drafter shapes (section T) and under CUDA graphs
(section E).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from treeflash.top_k import _pack, _unpack, top_k_kernel
from treeflash.tree import DraftTree, _beam_pairs


@triton.jit
def _build(TopScores, TopTokens, Bonus, BeamOf, ChildOf, Scores, ParentBeam, Tokens, Keys, NodeOf,
           OutTokens, OutParents, OutDepths, OutValid, OutScores, OutRanked,
           sts_s, sts_d, stt_s, stt_d, BUDGET, K, DEPTHS, PAIRS,
           BP: tl.constexpr, P2: tl.constexpr, N2: tl.constexpr, KEYS: tl.constexpr):
    s = tl.program_id(0)
    cands = DEPTHS * BUDGET  # candidate c = depth0 * BUDGET + beam position
    row = s * cands
    keys = Keys + s * KEYS
    j = tl.arange(0, BP)
    in_beam = j < BUDGET
    neg_inf = float("-inf")

    # Depth 1: the root's K best children, padded to the budget. The beam's scores stay in registers
    # from depth to depth (`beam`); the scratch rows only collect them for the global choice.
    beam = tl.load(TopScores + s * sts_s + j, mask=j < K, other=neg_inf)
    tl.store(Scores + row + j, beam, mask=in_beam)
    tl.store(Tokens + row + j, tl.load(TopTokens + s * stt_s + j, mask=j < K, other=0), mask=in_beam)
    tl.store(ParentBeam + row + j, tl.zeros([BP], tl.int64), mask=in_beam)

    p = tl.arange(0, P2)
    is_pair = p < PAIRS
    beam_of = tl.load(BeamOf + p, mask=is_pair, other=0)
    child_of = tl.load(ChildOf + p, mask=is_pair, other=0)
    for d in range(1, DEPTHS):
        score = tl.gather(beam, beam_of, 0) + \
            tl.load(TopScores + s * sts_s + d * sts_d + child_of, mask=is_pair, other=neg_inf)
        key = tl.where(is_pair, _pack(score, P2 - 1 - p), -1)
        best = tl.topk(key, BP)  # descending; PAIRS >= BUDGET, so the first BUDGET are real pairs
        beam, low = _unpack(best)
        pair = tl.where(in_beam, P2 - 1 - low, 0)
        child = tl.gather(child_of, pair, 0)
        tl.store(Scores + row + d * BUDGET + j, beam, mask=in_beam)
        tl.store(ParentBeam + row + d * BUDGET + j, tl.gather(beam_of, pair, 0), mask=in_beam)
        tl.store(Tokens + row + d * BUDGET + j,
                 tl.load(TopTokens + s * stt_s + d * stt_d + child, mask=in_beam, other=0), mask=in_beam)

    # The global choice: the best BUDGET of all candidates, ties to the shallower, then earlier one.
    tl.debug_barrier()
    c = tl.arange(0, N2)
    is_cand = c < cands
    score = tl.load(Scores + row + c, mask=is_cand, other=neg_inf)
    ranked = tl.sort(tl.where(is_cand, _pack(score, N2 - 1 - c), -1), descending=True)
    tl.store(keys + c, ranked)
    ranked_score, _ = _unpack(ranked)
    tl.store(OutRanked + row + c, ranked_score, mask=is_cand)
    tl.store(NodeOf + s * N2 + c, tl.full([N2], -1, tl.int64))
    tl.debug_barrier()
    _, low = _unpack(tl.load(keys + j, mask=in_beam, other=0))
    chosen = N2 - 1 - low
    chosen = tl.sort(tl.where(in_beam, chosen, 2 * N2))  # depth-major: parents before children
    tl.store(NodeOf + s * N2 + chosen, j + 1, mask=in_beam)
    tl.debug_barrier()
    depth0 = chosen // BUDGET
    parent_cand = (depth0 - 1) * BUDGET + tl.load(ParentBeam + row + chosen, mask=in_beam, other=0)
    parent = tl.load(NodeOf + s * N2 + tl.maximum(parent_cand, 0), mask=in_beam, other=0)
    node_score = tl.load(Scores + row + chosen, mask=in_beam, other=neg_inf)
    valid = node_score > neg_inf
    parent = tl.where((depth0 > 0) & valid, parent, 0)

    out = s * (BUDGET + 1)
    is_root = j == 0
    tl.store(OutTokens + out + j, tl.load(Bonus + s + j * 0), mask=is_root)
    tl.store(OutParents + out + j, tl.zeros([BP], tl.int64), mask=is_root)
    tl.store(OutDepths + out + j, tl.zeros([BP], tl.int64), mask=is_root)
    tl.store(OutValid + out + j, tl.full([BP], 1, tl.int8), mask=is_root)
    tl.store(OutScores + out + j, tl.zeros([BP], tl.float32), mask=is_root)
    node = out + 1 + j
    tl.store(OutTokens + node, tl.load(Tokens + row + chosen, mask=in_beam, other=0), mask=in_beam)
    tl.store(OutParents + node, parent, mask=in_beam)
    tl.store(OutDepths + node, depth0 + 1, mask=in_beam)
    tl.store(OutValid + node, valid.to(tl.int8), mask=in_beam)
    tl.store(OutScores + node, node_score, mask=in_beam)


def build_warps(candidates: int) -> int:
    """Warps of the builder's program for `candidates` (a power of two) keys. Measured on the H200 at 15
    depths (benchmarks/h200-treekernel-256/, us per build with the top-k, 4 / 8 / 16 warps): budget 64
    (1024 keys) 84.5 / 68.5 / 69.5, 128 (2048) 203.1 / 150.9 / 126.8, 256 (4096) 414.0 / 408.6 / 350.7.
    Smaller trees keep the four they were measured with."""
    if candidates <= 512:
        return 4
    return 8 if candidates <= 1024 else 16


def build_tree_kernel(bonus: torch.Tensor, logprobs: torch.Tensor, budget: int,
                      top: tuple[torch.Tensor, torch.Tensor] | None = None) -> DraftTree:
    """`build_tree(bonus, logprobs, budget)` (default branching): `top_k_kernel` (two or three launches), then
    the builder (one). bonus: [S] long; logprobs: [S, D, V]. Returns the same DraftTree (where log-probs tie
    at the top-k's edge, the tree of the top-k lists this kernel ranks by token).
    top: the top-k lists (scores, tokens) to build from instead of `top_k_kernel`'s (tests hand both
    builders torch.topk's, whose order among equal scores is its own)."""
    slots, depths, vocab = logprobs.shape
    k = min(budget, vocab)
    top_scores, top_tokens = top if top is not None else top_k_kernel(logprobs, k)
    pairs, beam_of, child_of = _beam_pairs(budget, k, logprobs.device)
    cands = depths * budget
    p2, n2 = triton.next_power_of_2(len(pairs)), triton.next_power_of_2(cands)
    dev = logprobs.device
    scratch_scores = torch.empty(slots, cands, dtype=torch.float32, device=dev)
    scratch_parent = torch.empty(slots, cands, dtype=torch.long, device=dev)
    scratch_tokens = torch.empty(slots, cands, dtype=torch.long, device=dev)
    keys = torch.empty(slots, n2, dtype=torch.long, device=dev)
    node_of = torch.empty(slots, n2, dtype=torch.long, device=dev)
    n = budget + 1
    tokens = torch.empty(slots, n, dtype=torch.long, device=dev)
    parents = torch.empty(slots, n, dtype=torch.long, device=dev)
    depth = torch.empty(slots, n, dtype=torch.long, device=dev)
    valid = torch.empty(slots, n, dtype=torch.int8, device=dev)
    scores = torch.empty(slots, n, dtype=torch.float32, device=dev)
    ranked = torch.empty(slots, cands, dtype=torch.float32, device=dev)
    _build[(slots,)](
        top_scores, top_tokens, bonus.long(), beam_of, child_of, scratch_scores, scratch_parent, scratch_tokens,
        keys, node_of, tokens, parents, depth, valid, scores, ranked,
        top_scores.stride(0), top_scores.stride(1), top_tokens.stride(0), top_tokens.stride(1),
        budget, k, depths, len(pairs),
        BP=triton.next_power_of_2(budget), P2=p2, N2=n2, KEYS=n2,
        num_warps=build_warps(n2))
    return DraftTree(tokens=tokens, parents=parents, depths=depth, valid=valid.bool(), scores=scores,
                     max_depth=depths, ranked_scores=ranked)
