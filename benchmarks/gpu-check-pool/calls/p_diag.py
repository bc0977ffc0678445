"""gpu_check P's rounds (30 rounds hopping over 10 graphs in one pool against the same rounds eagerly), each
field compared on its own and per round, under five settings: as landed; the walk / verify-mask kernels off
(torch ops); no prompt lookup; the lookup kernel off (torch ops); the Triton tree builder and path kernels
off; each round's tree scores compared too, and the read-back's differing cells listed.
`python3 p_diag.py OUT.json [repeat | first NAME]` (repeat: as landed, the walk / mask kernels off and the lookup
kernel off, three times each; first NAME: the setting NAME first in a fresh process, then as landed; a sixth
setting, "compiled pieces off", runs the decoder's norms and rotary eagerly: `compile_kernels=False`)."""
import json
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, "scripts")
import gpu_check as G  # noqa: E402

import treeflash.round as R  # noqa: E402
from treeflash import LLM  # noqa: E402
from treeflash.runner import GraphRunner  # noqa: E402

FIELDS = ("readback", "tokens", "parents", "emitted", "seq_lens", "bonus")


def hop(runner, graphed, eager):
    rows = []
    for i, (n, budget) in enumerate(G.POOL_ROUNDS):
        g, e = runner.round(n, budget), eager.round(n, budget)
        pairs = [(g.readback, e.readback), (g.tree.tokens, e.tree.tokens), (g.tree.parents, e.tree.parents),
                 (g.walk.emitted, e.walk.emitted), (graphed.state.seq_lens, eager.state.seq_lens),
                 (graphed.state.bonus, eager.state.bonus)]
        bad = [f for f, (a, b) in zip(FIELDS, pairs) if not torch.equal(a[:n], b[:n])]
        scores = (g.tree.scores[:n] - e.tree.scores[:n]).abs().max().item() if g.tree.scores is not None else 0.0
        if bad or scores:
            columns = (g.readback[:n] != e.readback[:n]).nonzero().tolist()
            rows.append({"round": i, "slots": n, "budget": budget, "differ": bad, "scores_max_abs_diff": scores,
                         "readback_cells": [(r, c, g.readback[r, c].item(), e.readback[r, c].item()) for r, c in columns],
                         "readback_columns": f"accepted, {g.walk.emitted.shape[1]} emitted, then m(B) per budget",
                         "g_seq": graphed.state.seq_lens.tolist(), "e_seq": eager.state.seq_lens.tolist(),
                         "g_emitted": g.walk.emitted[:n].tolist(), "e_emitted": e.walk.emitted[:n].tolist()})
    return rows


def case(name, target, drafter, ngram=None, path_kernels=True, tree_kernel=None, lookup_kernel=True,
         compile_kernels=True):
    original, original_graft = R.use_path_kernels, R.graft_lookup
    if not path_kernels:
        R.use_path_kernels = lambda setting, device: False
    if not lookup_kernel:
        R.graft_lookup = lambda *a: original_graft(*a, kernel=False)
    try:
        llm = LLM(target, device=G.DEVICE, dtype="float32", draft_model=drafter, spec="ddtree", tree_budget="auto",
                  time_stages=False, ngram_tokens=ngram, compile_kernels=compile_kernels)
        graphed, eager = (G.mixed_speculator(llm, None, capacity=1024) for _ in range(2))
        for sp in (graphed, eager):
            sp.tree_kernel = tree_kernel
        rows = hop(GraphRunner(graphed, log=None), graphed, eager)
    finally:
        R.use_path_kernels, R.graft_lookup = original, original_graft
    print(name, "rounds differing:", [(r["round"], r["slots"], r["budget"], r["differ"], r["scores_max_abs_diff"],
                                       r["readback_cells"]) for r in rows], flush=True)
    return {"case": name, "differing": rows}


if __name__ == "__main__":
    out = []
    G.DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
    with tempfile.TemporaryDirectory() as tmp:
        targets = G.tiny_targets(Path(tmp))
        drafter = G.tiny_drafter(Path(tmp))
        cases = [("as landed", {}), ("walk and mask kernels off", {"path_kernels": False}),
                 ("no prompt lookup", {"ngram": 0}), ("lookup kernel off (torch ops)", {"lookup_kernel": False}),
                 ("tree builder and path kernels off", {"tree_kernel": False}),
                 ("compiled pieces off", {"compile_kernels": False})]
        if len(sys.argv) > 2 and sys.argv[2] == "repeat":  # as landed, walk / mask off, lookup kernel off, 3x each
            cases = [c for c in cases[:2] + cases[3:4] for _ in range(3)]
        elif len(sys.argv) > 2:  # "first NAME": that setting first in the process, then as landed
            cases = [c for c in cases if c[0] == sys.argv[3]] + cases[:1]
        for name, kw in cases:
            try:
                out.append(case(name, targets["qwen3"], drafter, **kw))
            except Exception as e:  # noqa: BLE001
                print(name, "ERROR", repr(e), flush=True)
                out.append({"case": name, "error": repr(e)})
            json.dump(out, open(sys.argv[1], "w"), indent=1)
