"""Which op makes the process's first admission differ from the next? Forward hooks on every module of the
target and drafter record each call's inputs and outputs while two speculators of gpu_check P admit their
four prompts (`mixed_speculator`, one after the other, on one LLM); the first module, in call order, whose
inputs are equal bit for bit in both speculators and whose outputs are not is named.
`python3 p_layers.py OUT.json [ATTENTION]` (TREEFLASH_P_LAYERS_EAGER=1: `compile_kernels=False`, the separate
projections and eager pieces)."""
import json
import os
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, "scripts")
import gpu_check as G  # noqa: E402

from treeflash import LLM  # noqa: E402


def flat(x):
    if isinstance(x, torch.Tensor):
        return [x.detach().clone()]
    if isinstance(x, (tuple, list)):
        return [t for y in x for t in flat(y)]
    return []


def same(a, b):
    return len(a) == len(b) and all(x.shape == y.shape and torch.equal(x, y) for x, y in zip(a, b))


if __name__ == "__main__":
    G.DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
    attention = sys.argv[2] if len(sys.argv) > 2 else None
    with tempfile.TemporaryDirectory() as tmp:
        targets = G.tiny_targets(Path(tmp))
        drafter = G.tiny_drafter(Path(tmp))
        llm = LLM(targets["qwen3"], device=G.DEVICE, dtype="float32", draft_model=drafter, spec="ddtree",
                  tree_budget="auto", time_stages=False,
                  compile_kernels=not os.environ.get("TREEFLASH_P_LAYERS_EAGER"))
        log = []
        hooks = [m.register_forward_hook(lambda m, i, o, name=f"{root}:{name}": log.append(
                     (name, flat(i), flat(o))))
                 for root, model in (("target", llm.model), ("drafter", llm.drafter))
                 for name, m in model.named_modules()]
        calls = []
        for _ in range(2):
            log.clear()
            G.mixed_speculator(llm, attention, capacity=1024)
            calls.append(list(log))
        for h in hooks:
            h.remove()
    first, second = calls
    rows = []
    for n, ((name, i1, o1), (name2, i2, o2)) in enumerate(zip(first, second)):
        if name != name2:
            rows.append({"call": n, "error": f"call order differs: {name} / {name2}"})
            break
        if not same(o1, o2):
            diff = [(list(x.shape), int((x != y).sum()), (x.double() - y.double()).abs().max().item())
                    for x, y in zip(o1, o2) if x.shape == y.shape and not torch.equal(x, y)]
            rows.append({"call": n, "module": name, "inputs_equal": same(i1, i2),
                         "input_shapes": [list(x.shape) for x in i1], "output_diffs": diff})
    result = {"attention": attention or "default", "calls": len(first), "differing_calls": rows[:40]}
    print("calls", len(first), "differing", len(rows), flush=True)
    for r in rows[:12]:
        print(r, flush=True)
    json.dump(result, open(sys.argv[1], "w"), indent=1)
