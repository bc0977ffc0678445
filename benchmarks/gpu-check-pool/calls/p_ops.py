"""Below the modules: call 7 found layer 0's attention block with equal inputs and different outputs in the
process's first admission, o_proj's input differing (with compile_kernels off, q/k/v's projections equal).
Between them are the query's norm and rotary (`Kernels.norm_rotary`) and `attend_new`: both wrapped here to
record their inputs and outputs (with the cache's rows they read), compile_kernels off, attention sdpa, while
two speculators of gpu_check P admit their prompts; the first call whose inputs are equal and outputs are not
is named, with its arguments' shapes. `python3 p_ops.py OUT.json`."""
import json
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, "scripts")
import gpu_check as G  # noqa: E402

import treeflash.models.transformer as T  # noqa: E402
from treeflash import LLM  # noqa: E402
from treeflash.models import kernels as K  # noqa: E402

LOG = []


def flat(x):
    if isinstance(x, torch.Tensor):
        return [x.detach().clone()]
    if isinstance(x, (tuple, list)):
        return [t for y in x for t in flat(y)]
    if hasattr(x, "__dict__") and not isinstance(x, torch.nn.Module):
        return [t for y in vars(x).values() for t in flat(y)]
    return []


def wrap(name, fn):
    def inner(*a, **kw):
        before = flat(list(a) + list(kw.values()))
        out = fn(*a, **kw)
        LOG.append((name, before, flat(out), flat(list(a) + list(kw.values()))))
        return out
    return inner


def same(a, b):
    return len(a) == len(b) and all(x.shape == y.shape and x.dtype == y.dtype and torch.equal(x, y)
                                    for x, y in zip(a, b))


if __name__ == "__main__":
    G.DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
    T.attend_new = wrap("attend_new", T.attend_new)
    object.__setattr__(K.EAGER, "norm_rotary", wrap("norm_rotary", K.EAGER.norm_rotary))
    import torch.nn.functional as F
    sdpa = F.scaled_dot_product_attention
    F.scaled_dot_product_attention = wrap("sdpa", sdpa)
    with tempfile.TemporaryDirectory() as tmp:
        targets = G.tiny_targets(Path(tmp))
        drafter = G.tiny_drafter(Path(tmp))
        llm = LLM(targets["qwen3"], device=G.DEVICE, dtype="float32", draft_model=drafter, spec="ddtree",
                  tree_budget="auto", time_stages=False, compile_kernels=False)
        calls = []
        for _ in range(2):
            LOG.clear()
            G.mixed_speculator(llm, "sdpa", capacity=1024)
            calls.append(list(LOG))
    rows = []
    for n, ((name, i1, o1, a1), (_, i2, o2, a2)) in enumerate(zip(*calls)):
        if not same(o1, o2) or not same(a1, a2):
            rows.append({"call": n, "op": name, "inputs_equal": same(i1, i2), "args_after_equal": same(a1, a2),
                         "input_shapes": [(list(x.shape), str(x.dtype)) for x in i1],
                         "input_diffs": [(j, int((x != y).sum())) for j, (x, y) in enumerate(zip(i1, i2))
                                         if x.shape == y.shape and not torch.equal(x, y)],
                         "output_diffs": [(list(x.shape), int((x != y).sum()),
                                           (x.double() - y.double()).abs().max().item())
                                          for x, y in zip(o1, o2) if x.shape == y.shape and not torch.equal(x, y)]})
    print("calls", len(calls[0]), "differing", len(rows), flush=True)
    for r in rows[:8]:
        print(r, flush=True)
    json.dump({"calls": len(calls[0]), "differing": rows[:40]}, open(sys.argv[1], "w"), indent=1)
