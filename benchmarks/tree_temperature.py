"""Which trees a drafter's distributions should be ranked at: acceptance against a draft temperature, exactly.

DDTree keeps the B prefixes with the largest sum of draft log-probs. Scaling the drafter's logits by 1/tau
before the log-softmax keeps each depth's order of tokens but trades depth against width: tau < 1 trusts the
drafter's top choices more (deeper, narrower trees), tau > 1 less. Any tree is lossless, so tau is free to
choose; this script measures which one accepts most. Along each prompt's decoding (the target's own tokens,
greedy or sampled), at every round it drafts once, builds the tree at every tau, verifies each tree and takes
its acceptance exactly: greedily, how deep the target's argmax path reaches into the tree; when sampling,
1 + the sum over nodes of the probability that the target's sample passes through the node (what the
lossless walk accepts on average). Then a round at tau = 1 moves the decoding on.

    python benchmarks/tree_temperature.py --prompts chat --temperature 0 --taus 0.5,0.7,1,1.4 --out t.json

Prompts (`--prompts`): 'chat', ShareGPT human turns of 40-79 characters (the training prompts were 80+, so none
of these was one), or 'code', HumanEval-form completions of treeflash's own documented functions (the training
code prompts came from the standard library and site-packages), or a `treeflash bench --dataset` name.
"""

from __future__ import annotations

import argparse
import json
import random
import time
from pathlib import Path

import torch

from treeflash.round import draft_log_probs
from treeflash.sampling import SamplingParams
from treeflash.tree import walk


def tuning_prompts(kind: str, count: int, seed: int = 0):
    """[(messages or None, text)]: prompts the shipped drafter was not trained on (see the module docstring)."""
    rng = random.Random(seed)
    if kind == "chat":
        from treeflash.train.prompts import sharegpt_prompts

        texts = [t for t in sharegpt_prompts(later_turns=True) if 40 <= len(t.strip()) < 80 and "?" in t]
        rng.shuffle(texts)
        return [([{"role": "user", "content": t}], None) for t in texts[:count]]
    if kind == "code":
        from treeflash.train.code_prompts import code_prompts

        items = code_prompts([Path(__file__).resolve().parents[1] / "treeflash"], seed=seed)
        return [(None, c.text) for c in items[:count]]
    from treeflash.bench.datasets import load_prompts

    return [(list(p.messages) if p.is_chat else None, None if p.is_chat else p.text)
            for p in load_prompts(kind)[:count]]


def one_slot(model, draft_model, budget: int, device: str = "cpu"):
    """(LLM, its speculator with one slot and 2,048 cache rows), to be driven round by round, float32."""
    from treeflash import LLM

    llm = LLM(model, draft_model=draft_model, device=device, dtype="float32", spec="ddtree", tree_budget=budget,
              max_num_seqs=1, time_stages=False)
    sp = llm.engine.speculator
    sp.reserve(2048)
    return llm, sp


def tree_acceptance(tree, logits: torch.Tensor, temperature: float) -> float:
    """Tokens the round emits with this tree (greedy) or on average (sampling), from the verify's logits [1, N, V]."""
    if temperature == 0:
        return float(walk(tree, logits.argmax(-1)).accepted[0])
    logp = torch.log_softmax(logits[0].float() / temperature, dim=-1)
    parents, tokens = tree.parents[0].tolist(), tree.tokens[0]
    node = logp[tree.parents[0], tokens]  # the parent's probability of each node's token
    node = torch.where(tree.valid[0], node, -torch.inf)
    path = [0.0] * len(parents)
    for i in range(1, len(parents)):  # parents precede children
        path[i] = path[parents[i]] + float(node[i])
    return 1.0 + sum(torch.tensor(path[1:]).exp().tolist())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None, help="target (default: the embedded default pair)")
    ap.add_argument("--draft-model", default=None)
    ap.add_argument("--prompts", default="chat", help="chat, code, or a bench dataset name (mtbench, humaneval, FILE)")
    ap.add_argument("--num-prompts", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=96, help="new tokens decoded per prompt")
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--budget", type=int, default=64)
    ap.add_argument("--taus", default="0.6,0.8,1,1.25,1.6")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    taus = [float(t) for t in args.taus.split(",")]
    llm, sp = one_slot(args.model, args.draft_model, args.budget)
    params = SamplingParams(temperature=args.temperature, max_tokens=args.max_tokens)
    eos = llm._eos_ids()
    rows, start = [], time.time()
    for i, (messages, text) in enumerate(tuning_prompts(args.prompts, args.num_prompts, args.seed)):
        ids = llm.chat_token_ids(messages) if messages else llm.encode(text)
        ids = ids[-1024:]  # the caches hold 2,048 rows: a long prompt keeps its end
        sp.release(0)
        sp.admit(0, ids, params, seed=args.seed + i)
        emitted = 0
        while emitted < args.max_tokens:
            with torch.inference_mode():
                state = sp.state
                sampling = sp.sampling(1)
                raw = sp.drafter.draft(sp.target, state.bonus, state.seq_lens, sp.draft_cache, sp.layout,
                                       None, sp.draft_head)
                row = {}
                for tau in taus:
                    temp = torch.tensor([(args.temperature or 1.0) * tau])
                    tree = sp.build(state.bonus, draft_log_probs(raw, temp), args.budget)
                    logits, _ = sp.verify(tree, state.seq_lens[:, None] + tree.depths, state, sp.cache)
                    row[tau] = tree_acceptance(tree, logits, args.temperature)
            result = sp.round(1, sampling=sampling)
            emitted_now = int(result.walk.accepted[0])
            emitted += emitted_now
            row["round"] = emitted_now  # the real round's (tau = 1): equal to row[1.0] when greedy
            rows.append(row)
            if set(result.walk.emitted[0, :emitted_now].tolist()) & eos:
                break
        mean = {tau: sum(r[tau] for r in rows) / len(rows) for tau in taus}
        print(f"prompt {i}: {len(rows)} rounds, " + ", ".join(f"tau {t}: {v:.3f}" for t, v in mean.items())
              + f" ({time.time() - start:.0f} s)", flush=True)
    json.dump({"args": vars(args), "mean": mean, "rounds": len(rows), "torch": torch.__version__,
               "rows": rows}, open(args.out, "w"), indent=1)


if __name__ == "__main__":
    main()
