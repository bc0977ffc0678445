"""What a drafter at its training optimum would give DDTree when sampling: trees from the target's own marginals.

A DFlash drafter proposes every depth of a block in one pass from the context alone: depth k cannot see the
token sampled at depth k - 1. What its cross-entropy loss can teach it at depth k is therefore at best the
target's *marginal* there (the next-k-th-token distribution, the tokens in between summed out), and DDTree
ranks prefixes by the sum of those per-depth log-probs. This script measures, at the same rounds of real
decodings, the exact acceptance of three trees of B nodes:

- `drafter`: the tree DDTree builds from the drafter's distributions (what the engine does);
- `marginal`: the tree DDTree builds from the target's marginals, estimated from M continuations sampled
  from the target (a drafter at its loss's optimum; `marginal_quarter`: from M / 4 of them, to show what
  the estimate's own noise costs);
- `paths`: the B most frequent prefixes among those continuations, an estimate of the best tree of B nodes
  anyone could draft (`oracle_acceptance.py` finds that bound exactly at other positions).
- `mix` (with --mix): the tree from the marginals of train-drafter's three modes in equal shares (the greedy
  continuation, the model card's T=0.2 / top_p 0.9, T=1), the optimum of a drafter not told the temperature.

Acceptance is exact (not sampled): 1 + the sum over the tree's nodes of the probability that the target's
sample passes through the node, from one verify of the tree. A round with the drafter's tree then moves the
decoding on, as the engine would. The continuations are sampled with transformers from the same weights.

    python benchmarks/marginal_oracle.py --dataset mtbench --num-prompts 16 --every 5 --max-tokens 64 \
        --rounds-every 3 --samples 128 --out marginal-mtbench-t1.json   (benchmarks/cpu-marginal-oracle/)
    (add --mix --mix-samples 32 for the `mix` column: marginal-mix-mtbench-t1.json there)
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from treeflash.sampling import SamplingParams
from treeflash.tree import DraftTree, build_tree

from tree_temperature import one_slot, tree_acceptance  # (the exact expected acceptance of a tree)


def sample_continuations(model, context: list[int], count: int, depth: int, temperature: float,
                         gen: torch.Generator, top_p: float = 1.0) -> torch.Tensor:
    """[count, depth] continuations of `context` sampled from the target (softmax at `temperature`, then the
    top-p nucleus; temperature 0: the greedy continuation, repeated): one prefill of the context, its cache
    repeated `count` times, then `depth` batched steps."""
    from transformers import DynamicCache

    device = next(model.parameters()).device
    out = model(input_ids=torch.tensor([context], device=device), past_key_values=DynamicCache(), use_cache=True)
    cache = out.past_key_values
    cache.batch_repeat_interleave(count)
    logits = out.logits[:, -1].float().expand(count, -1)
    tokens = []
    for step in range(depth):
        # Inverse-CDF sampling on the model's device: torch.multinomial over [count, vocab] rows took ~1.4 s
        # a step at 1,024 rows (on the CPU, and on the CPU again when the rows came back from a GPU).
        if temperature == 0:
            nxt = logits.argmax(-1, keepdim=True)
        else:
            probs = torch.softmax(logits / temperature, dim=-1)
            if top_p < 1.0:  # the smallest set of most probable tokens whose mass reaches top_p
                ranked, order = probs.sort(-1, descending=True)
                outside = ranked.cumsum(-1) - ranked >= top_p
                probs = torch.zeros_like(probs).scatter_(-1, order, ranked.masked_fill(outside, 0.0))
            cdf = probs.cumsum(-1)
            u = torch.rand(count, 1, generator=gen, device=device) * cdf[:, -1:]
            nxt = torch.searchsorted(cdf, u, right=True).clamp_max(cdf.shape[-1] - 1)
        tokens.append(nxt[:, 0])
        if step + 1 < depth:
            out = model(input_ids=nxt, past_key_values=cache, use_cache=True)
            logits = out.logits[:, -1].float()
    return torch.stack(tokens, dim=1)


def frequencies(samples: torch.Tensor, vocab: int) -> torch.Tensor:
    """[depth, vocab] each depth's empirical token frequencies among the continuations [count, depth]."""
    count, depth = samples.shape
    freq = torch.zeros(depth, vocab)
    freq.scatter_add_(1, samples.T.cpu(), torch.ones(depth, count))
    return freq / count


def marginal_log_probs(samples: torch.Tensor | list[torch.Tensor], vocab: int) -> torch.Tensor:
    """[1, depth, vocab] log of each depth's empirical token frequencies (several sample sets: the equal mix of
    their frequencies); unseen tokens get a log-prob far below any seen one's, so the builder never prefers
    them (and any tree is lossless anyway)."""
    sets = samples if isinstance(samples, list) else [samples]
    return torch.log(sum(frequencies(s, vocab) for s in sets) / len(sets) + 1e-12)[None]


def path_tree(bonus: torch.Tensor, samples: torch.Tensor, budget: int) -> DraftTree:
    """The `budget` most frequent prefixes among the sampled continuations as a tree (prefix-closed: a prefix
    is at least as frequent as its extensions; ties go to the shorter, then the first seen)."""
    counts: dict[tuple[int, ...], int] = {}
    for row in samples.tolist():
        for k in range(1, len(row) + 1):
            counts[tuple(row[:k])] = counts.get(tuple(row[:k]), 0) + 1
    order = {p: i for i, p in enumerate(counts)}
    chosen = sorted(counts, key=lambda p: (-counts[p], len(p), order[p]))[:budget]
    chosen.sort(key=len)  # parents before children
    index = {p: i + 1 for i, p in enumerate(chosen)}
    n = 1 + budget
    tokens = torch.full((1, n), int(bonus[0]), dtype=torch.long)
    parents = torch.zeros(1, n, dtype=torch.long)
    depths = torch.zeros(1, n, dtype=torch.long)
    valid = torch.zeros(1, n, dtype=torch.bool)
    valid[0, 0] = True
    for p, i in index.items():
        tokens[0, i], parents[0, i], depths[0, i], valid[0, i] = p[-1], index.get(p[:-1], 0), len(p), True
    return DraftTree(tokens.to(bonus.device), parents.to(bonus.device), depths.to(bonus.device),
                     valid.to(bonus.device), torch.zeros(1, n, device=bonus.device),
                     max_depth=int(depths.max()))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None, help="target (default: the embedded default pair)")
    ap.add_argument("--draft-model", default=None)
    ap.add_argument("--dataset", default="mtbench", help="a bench dataset: mtbench, humaneval or FILE.jsonl")
    ap.add_argument("--num-prompts", type=int, default=16)
    ap.add_argument("--every", type=int, default=5, help="take every N-th prompt of the set (MT-Bench is in "
                    "category order: 5 spreads 16 prompts over its eight categories)")
    ap.add_argument("--max-tokens", type=int, default=64, help="new tokens decoded per prompt")
    ap.add_argument("--rounds-every", type=int, default=3, help="measure the trees at every N-th round")
    ap.add_argument("--samples", type=int, default=128, help="continuations sampled per measured round (M)")
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--budget", type=int, default=64)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--mix", action="store_true", help="also the tree of the training data's mix of marginals "
                    "(train-drafter's three modes in equal shares: the greedy continuation, the model card's "
                    "T=0.2 / top_p 0.9 and T=1), which is what a drafter not told the temperature learns at best")
    ap.add_argument("--mix-samples", type=int, default=32, help="continuations at T=0.2 / top_p 0.9 for --mix")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    if args.temperature <= 0:
        raise SystemExit("--temperature must be > 0: greedily the target's marginals are its one greedy path")
    from transformers import AutoModelForCausalLM

    from treeflash.bench.datasets import load_prompts

    llm, sp = one_slot(args.model, args.draft_model, args.budget, args.device)
    hf = AutoModelForCausalLM.from_pretrained(llm.model_dir, dtype=torch.float32).to(args.device).eval()
    depth = sp.drafter.config.block_size - 1
    vocab = llm.config.vocab_size
    params = SamplingParams(temperature=args.temperature, max_tokens=args.max_tokens)
    eos = llm._eos_ids()
    gen = torch.Generator(device=args.device).manual_seed(args.seed)
    # The mix's extra samples draw from their own stream, so the T=1 samples (and every other column) are
    # those of a run without --mix.
    mix_gen = torch.Generator(device=args.device).manual_seed(args.seed + 1)
    kinds = ("drafter", "marginal", "marginal_quarter", "paths") + (("mix",) if args.mix else ())
    rows, start = [], time.time()
    for i, prompt in enumerate(load_prompts(args.dataset)[::args.every][:args.num_prompts]):
        ids = llm.chat_token_ids(list(prompt.messages)) if prompt.is_chat else llm.encode(prompt.text)
        ids = ids[-1024:]
        sp.release(0)
        sp.admit(0, ids, params, seed=args.seed + i)
        sequence = ids + [int(sp.state.bonus[0])]  # the bonus token ends it: the root of the next tree
        emitted, round_index = 0, 0
        while emitted < args.max_tokens:
            with torch.inference_mode():
                state = sp.state
                sampling = sp.sampling(1)
                if round_index % args.rounds_every == 0:
                    samples = sample_continuations(hf, sequence, args.samples, depth, args.temperature, gen)
                    trees = {
                        "drafter": sp.build(state.bonus, sp.draft(state, sampling), args.budget),
                        "marginal": build_tree(state.bonus, marginal_log_probs(samples, vocab).to(state.bonus.device),
                                               budget=args.budget),
                        "marginal_quarter": build_tree(
                            state.bonus, marginal_log_probs(samples[: args.samples // 4], vocab).to(state.bonus.device),
                            budget=args.budget),
                        "paths": path_tree(state.bonus, samples, args.budget),
                    }
                    if args.mix:
                        greedy = sample_continuations(hf, sequence, 1, depth, 0.0, mix_gen)
                        card = sample_continuations(hf, sequence, args.mix_samples, depth, 0.2, mix_gen, top_p=0.9)
                        mix = marginal_log_probs([greedy, card, samples], vocab).to(state.bonus.device)
                        trees["mix"] = build_tree(state.bonus, mix, budget=args.budget)
                    row = {"prompt": prompt.id, "position": len(sequence) - len(ids)}
                    for kind, tree in trees.items():
                        logits, _ = sp.verify(tree, state.seq_lens[:, None] + tree.depths, state, sp.cache)
                        row[kind] = tree_acceptance(tree, logits, args.temperature)
                    rows.append(row)
                result = sp.round(1, sampling=sampling)
            n = int(result.walk.accepted[0])
            new = result.walk.emitted[0, :n].tolist()
            sequence += new
            emitted += n
            round_index += 1
            if set(new) & eos:
                break
        if rows:
            mean = {k: sum(r[k] for r in rows) / len(rows) for k in kinds}
            print(f"prompt {i} ({prompt.id}): {len(rows)} rounds measured, "
                  + ", ".join(f"{k} {v:.3f}" for k, v in mean.items()) + f" ({time.time() - start:.0f} s)", flush=True)
            # Written after every prompt: a run stopped early keeps what it measured.
            json.dump({"args": vars(args), "mean": mean, "measured_rounds": len(rows), "prompts": i + 1,
                       "torch": torch.__version__, "device": str(state.bonus.device), "rows": rows},
                      open(args.out, "w"), indent=1)


if __name__ == "__main__":
    main()
