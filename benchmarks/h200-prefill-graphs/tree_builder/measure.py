"""A/B of the tree builder's selections (a negative result, kept for the record): treeflash.tree.build_tree
(stable sorts) vs the same builder selecting by one top-k of exact int64 keys ordered as (score, -index),
which picks exactly what the stable sort picks. Timed as CUDA graph replays in one run, same inputs.

  python benchmarks/h200-prefill-graphs/tree_builder/measure.py [--out tree_builder.json]

Shapes: draft depth 15 (block 16), vocabularies of SmolLM2 (49,152) and Qwen3 (151,936), budgets 64 and
256, batch 1 and 8; milliseconds per build (median of 50 replays). On the H200 the top-k variant was
1.3-1.9x slower (tree_builder.json), so the library keeps the sorts.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from treeflash.tree import DraftTree, build_tree  # noqa: E402


def best_by_topk(scores: torch.Tensor, n: int) -> torch.Tensor:
    """The first n indices of a stable descending sort of scores [S, C], by one top-k of int64 keys."""
    bits = (scores + 0.0).view(torch.int32).long()  # + 0.0 turns -0.0 into +0.0
    monotone = torch.where(bits < 0, bits ^ 0x7FFFFFFF, bits)
    index = torch.arange(scores.shape[-1], device=scores.device)
    return ((monotone << 32) | (0xFFFFFFFF - index)).topk(n, dim=-1).indices


def build_tree_topk(bonus: torch.Tensor, logprobs: torch.Tensor, budget: int) -> DraftTree:
    """build_tree with every stable sort replaced by best_by_topk (same tree)."""
    slots, depth_count, vocab = logprobs.shape
    k = min(budget, vocab)
    top_scores, top_tokens = logprobs.float().topk(k, dim=-1)
    beam_scores = torch.full((slots, budget), -torch.inf, device=logprobs.device)
    beam_scores[:, :k] = top_scores[:, 0]
    beam_tokens = torch.zeros(slots, budget, dtype=torch.long, device=logprobs.device)
    beam_tokens[:, :k] = top_tokens[:, 0]
    scores, tokens, parent_beam = [beam_scores], [beam_tokens], [torch.zeros_like(beam_tokens)]
    for d in range(1, depth_count):
        candidates = (beam_scores[:, :, None] + top_scores[:, d, None, :]).flatten(1)
        order = best_by_topk(candidates, budget)
        beam_scores = candidates.gather(1, order)
        beam_tokens = top_tokens[:, d].gather(1, order % k)
        scores.append(beam_scores)
        tokens.append(beam_tokens)
        parent_beam.append(order // k)
    all_scores = torch.cat(scores, dim=1)
    chosen = best_by_topk(all_scores, budget).sort(dim=-1).values
    node_of = torch.full_like(all_scores, -1, dtype=torch.long)
    node_of.scatter_(1, chosen, torch.arange(1, budget + 1, device=logprobs.device).expand(slots, budget))
    depth0 = chosen // budget
    parent = node_of.gather(1, ((depth0 - 1) * budget + torch.cat(parent_beam, dim=1).gather(1, chosen)).clamp_min(0))
    node_scores = all_scores.gather(1, chosen)
    valid = node_scores > -torch.inf
    parent = torch.where((depth0 > 0) & valid, parent, 0)
    zero = torch.zeros(slots, 1, dtype=torch.long, device=logprobs.device)
    return DraftTree(tokens=torch.cat([bonus[:, None], torch.cat(tokens, dim=1).gather(1, chosen)], dim=1),
                     parents=torch.cat([zero, parent], dim=1), depths=torch.cat([zero, depth0 + 1], dim=1),
                     valid=torch.cat([torch.ones_like(zero, dtype=torch.bool), valid], dim=1),
                     scores=torch.cat([zero.float(), node_scores], dim=1), max_depth=depth_count)


def time_build(builder, bonus, logprobs, budget) -> tuple[float, DraftTree]:
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            builder(bonus, logprobs, budget)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = builder(bonus, logprobs, budget)
    times = []
    for _ in range(50):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return sorted(times)[len(times) // 2], out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="tree_builder.json")
    args = ap.parse_args()
    rows = []
    gen = torch.Generator(device="cuda").manual_seed(0)
    for vocab in (49152, 151936):
        for batch in (1, 8):
            logprobs = torch.log_softmax(3 * torch.randn(batch, 15, vocab, device="cuda", generator=gen), -1)
            bonus = torch.zeros(batch, dtype=torch.long, device="cuda")
            for budget in (64, 256):
                sort_ms, a = time_build(build_tree, bonus, logprobs, budget)
                topk_ms, b = time_build(build_tree_topk, bonus, logprobs, budget)
                same = all(torch.equal(getattr(a, f), getattr(b, f)) for f in ("tokens", "parents", "depths", "valid"))
                row = {"vocab": vocab, "batch": batch, "budget": budget, "sort_ms": round(sort_ms, 4),
                       "topk_ms": round(topk_ms, 4), "identical_trees": same}
                rows.append(row)
                print(row, flush=True)
    Path(args.out).write_text(json.dumps({"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                                          "command": "python benchmarks/h200-prefill-graphs/tree_builder/measure.py",
                                          "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
