"""The most tokens per round that any drafter could give a tree of B nodes when sampling: a bound from the target.

A lossless tree verifier emits the target's own sample, and a drafted node is accepted only when that sample
passes through it. So a round whose tree holds nodes v emits on average 1 + sum_v P(the sample's path
reaches v) tokens: the bonus token plus the drafted ones accepted. Over all trees of B nodes below the root,
the largest such sum is the B largest path probabilities of the target's continuation (the best set is
prefix-closed: a path is at least as probable as its extensions), whatever drafted the tree. This script
finds those paths exactly, level by level, by asking the target for the next-token distributions of every
path that can still be among them (one forward a level over the cached context, ancestors-only mask), at
positions along the target's own sampled continuations, and prints the mean bound per budget.

The bound is per position; a decoding run's rounds start where the previous one stopped, so its mean over
rounds can differ from the mean over positions. Greedy decoding's bound is B + 1 (one path of probability 1).

    python benchmarks/oracle_acceptance.py --model HF_DIR --dataset mtbench --num-prompts 20 --every 4 --positions 4 \
        --out bound.json
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from treeflash.bench.datasets import load_prompts


def next_distributions(model, cache_len: int, cache, paths: list[tuple[int, ...]], temperature: float):
    """{path: the target's next-token probabilities after context + path} for every path, in one forward of
    the union of their prefixes over the cached context (cropped back afterwards)."""
    nodes = sorted({p[:i] for p in paths for i in range(1, len(p) + 1)}, key=len)
    index = {node: i for i, node in enumerate(nodes)}
    n = len(nodes)
    tokens = torch.tensor([[node[-1] for node in nodes]])
    positions = torch.tensor([[cache_len + len(node) - 1 for node in nodes]])
    visible = torch.zeros(n, cache_len + n, dtype=torch.bool)
    visible[:, :cache_len] = True
    for node, i in index.items():
        for k in range(1, len(node) + 1):
            visible[i, cache_len + index[node[:k]]] = True
    mask = torch.zeros(1, 1, n, cache_len + n).masked_fill(~visible, float("-inf"))
    logits = model(input_ids=tokens, position_ids=positions, attention_mask=mask, past_key_values=cache,
                   use_cache=True).logits[0]
    cache.crop(-n)  # back to the context alone
    probs = torch.softmax(logits.float() / temperature, dim=-1)
    return {p: probs[index[p]] for p in paths}


def best_tree_masses(model, context: list[int], temperature: float, budget: int) -> list[float]:
    """The path probabilities of the best `budget`-node tree after `context` (its last token the root), largest
    first: their running sums are the best trees of every smaller budget too.

    Level by level: the budget-th largest probability among the paths found so far, `floor`, can only grow
    and never exceeds the true budget-th largest, and a path below it cannot be in the tree, nor can its
    extensions (they are no more probable). So each level expands, in one forward, every path found at the
    level before that is at least `floor`; when none is left the best `budget` found are the best of all."""
    from transformers import DynamicCache

    with torch.no_grad():
        cache = model(input_ids=torch.tensor([context[:-1]]), past_key_values=DynamicCache(),
                      use_cache=True).past_key_values
        ctx, root = len(context) - 1, (context[-1],)
        found: dict[tuple[int, ...], float] = {}
        level = {root: 1.0}
        while level:
            dists = next_distributions(model, ctx, cache, list(level), temperature)
            children = {}
            for path, mass in level.items():
                top = dists[path].topk(min(budget, dists[path].numel()))
                for p, t in zip(top.values.tolist(), top.indices.tolist()):
                    if p > 0:
                        children[path + (t,)] = mass * p
            found.update(children)
            best = sorted(found.values(), reverse=True)[:budget]
            floor = best[-1] if len(best) == budget else 0.0
            level = {path: mass for path, mass in children.items() if mass >= floor}
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True, help="an HF directory of the target (e.g. treeflash's converted GGUF)")
    ap.add_argument("--dataset", default="mtbench")
    ap.add_argument("--num-prompts", type=int, default=20)
    ap.add_argument("--every", type=int, default=1, help="take every N-th prompt of the set (MT-Bench is in "
                    "category order: 4 spreads 20 prompts over its eight categories)")
    ap.add_argument("--positions", type=int, default=8, help="positions per continuation")
    ap.add_argument("--max-tokens", type=int, default=128, help="sampled continuation length")
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--budgets", default="8,16,32,64", help="tree sizes (nodes below the root) to bound")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    budgets = sorted(int(b) for b in args.budgets.split(","))
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(args.seed)
    tok = AutoTokenizer.from_pretrained(args.model)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32, attn_implementation="eager").eval()
    gen = torch.Generator().manual_seed(args.seed)
    rows, start = [], time.time()
    for prompt in load_prompts(args.dataset)[::args.every][:args.num_prompts]:
        if prompt.is_chat:
            # As treeflash's LLM.chat_token_ids: the template's text, then its tokens.
            text = tok.apply_chat_template(list(prompt.messages), tokenize=False, add_generation_prompt=True)
            ids = tok.encode(text, add_special_tokens=False)
        else:
            ids = tok.encode(prompt.text)
        with torch.no_grad():
            out = model.generate(torch.tensor([ids]), do_sample=True, temperature=args.temperature, top_k=0,
                                 top_p=1.0, max_new_tokens=args.max_tokens)
        continuation = out[0, len(ids):].tolist()
        # Rounds start after a sampled (bonus) token: positions 1 .. len - 1 of the continuation.
        picks = torch.randperm(max(1, len(continuation) - 1), generator=gen)[:args.positions] + 1
        for t in sorted(picks.tolist()):
            masses = best_tree_masses(model, ids + continuation[:t], args.temperature, budgets[-1])
            sums = {b: 1 + sum(masses[:b]) for b in budgets}
            rows.append({"prompt": prompt.id, "position": t, "bound": sums, "top1": masses[0]})
        mean = {b: sum(r["bound"][b] for r in rows) / len(rows) for b in budgets}
        print(f"{prompt.id}: {len(rows)} positions, mean bound " + ", ".join(f"B={b} {v:.2f}" for b, v in mean.items())
              + f" ({time.time() - start:.0f} s)", flush=True)
    json.dump({"args": vars(args), "budgets": budgets, "mean_bound": mean, "rows": rows,
               "torch": torch.__version__}, open(args.out, "w"), indent=1)


if __name__ == "__main__":
    main()
