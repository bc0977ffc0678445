"""gpu_check P's hop on the CPU with the CUDA round's kernels: the walk / verify-mask, lookup and tree-builder
kernels run through Triton's interpreter, CUDA's lookup rows kept (no `compact`), and each graph key's first
round preceded by the runner's warm-up (the round twice, then the state restored), against the same rounds
with no warm-up. Compares the read-back, the tree builder's ranked scores, the tree's tokens, the emitted
tokens and the lengths, round by round. No CUDA graph or pool: what it can rule out is the kernels' and the
warm-up's part. `TRITON_INTERPRET=1 python3 p_cpu.py` from the repository root (~10 min on 2 cores)."""
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, "tests")
from triton_interpreter import mend_interpreter  # noqa: E402

mend_interpreter()
sys.path.insert(0, "scripts")
import gpu_check as G  # noqa: E402

import treeflash.round as R  # noqa: E402
from treeflash import LLM  # noqa: E402
from treeflash.lookup import keep_slots  # noqa: E402
from treeflash.runner import _restore, _save  # noqa: E402

G.DEVICE = "cpu"
graft = R.graft_lookup
R.use_path_kernels = lambda setting, device: True
R.graft_lookup = lambda *a: graft(*a, kernel=True)
R.use_tree_kernel = lambda setting, device, depths, budget: True
R.compact_lookup = lambda tree, size, keep=None: keep_slots(tree, size, keep) if keep is not None else tree


def differ(x, y, n):
    return (x is None) != (y is None) or (x is not None and not torch.equal(x[:n], y[:n]))


with tempfile.TemporaryDirectory() as tmp:
    targets, drafter = G.tiny_targets(Path(tmp)), G.tiny_drafter(Path(tmp))
    llm = LLM(targets["qwen3"], device="cpu", dtype="float32", draft_model=drafter, spec="ddtree",
              tree_budget="auto", time_stages=False, ngram_tokens=8)
    warmed, plain = (G.mixed_speculator(llm, "splitkv", capacity=1024) for _ in range(2))
    seen, bad = set(), []
    for i, (n, budget) in enumerate(G.POOL_ROUNDS):
        bucket = 1 if n == 1 else (2 if n == 2 else 4)  # the runner's buckets for 4 slots
        if (bucket, budget) not in seen:
            seen.add((bucket, budget))
            saved = _save(warmed)
            for _ in range(2):
                warmed.round(bucket, budget)
                _restore(warmed, saved)
        g, e = warmed.round(n, budget), plain.round(n, budget)
        fields = [("read-back", g.readback, e.readback), ("ranked", g.tree.ranked_scores, e.tree.ranked_scores),
                  ("tokens", g.tree.tokens, e.tree.tokens), ("emitted", g.walk.emitted, e.walk.emitted),
                  ("lengths", warmed.state.seq_lens, plain.state.seq_lens)]
        d = [name for name, x, y in fields if differ(x, y, n)]
        print(i, n, budget, d, flush=True)
        if d:
            bad.append((i, n, budget, d))
    print("rounds differing:", bad, flush=True)
