"""The tree kernel's warps at budgets 64-256: time per build (top-k + kernel), trees equal to build_tree's."""
import json, sys
import torch
sys.path.insert(0, "benchmarks")
from tree_kernel_ab import time_graph, same
from treeflash import tree_kernel
from treeflash.tree import build_tree
rows = []
for vocab in (16384, 151936):
    for budget in (64, 128, 256, 512):
        lp = torch.randn(1, 15, vocab, device="cuda", generator=torch.Generator(device="cuda").manual_seed(budget)).mul_(3)
        lp = lp.log_softmax(-1)
        bonus = torch.zeros(1, dtype=torch.long, device="cuda")
        want = build_tree(bonus, lp, budget)
        row = {"vocab": vocab, "budget": budget, "ops_us": time_graph(lambda: build_tree(bonus, lp, budget))[0]}
        for warps in (4, 8, 16):
            tree_kernel.build_warps = lambda n2, w=warps: w
            try:
                us, out = time_graph(lambda: tree_kernel.build_tree_kernel(bonus, lp, budget))
                row[f"w{warps}_us"] = us
                row[f"w{warps}_equal"] = same(out, want)
            except Exception as e:
                row[f"w{warps}_error"] = repr(e)[:300]
        print(json.dumps(row), flush=True)
        rows.append(row)
json.dump(rows, open(sys.argv[1], "w"), indent=1)
