"""Is the process's first speculator different from the ones after it, right after admission (eager prefill
only, no round yet)? Four speculators of gpu_check P (`mixed_speculator`) on one LLM, made one after another;
every tensor they hold (target and drafter caches, history, slot state, sampling rows) compared bit for bit,
the first against the second and the second against the third, then each after one eager round.
`python3 p_admit.py OUT.json`."""
import json
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, "scripts")
import gpu_check as G  # noqa: E402

from treeflash import LLM  # noqa: E402


def tensors(obj, prefix="", seen=None, depth=0):
    seen = set() if seen is None else seen
    if id(obj) in seen or depth > 4:
        return {}
    seen.add(id(obj))
    if isinstance(obj, torch.Tensor):
        return {prefix: obj}
    if isinstance(obj, torch.nn.Module):
        return {}  # the shared models: the same object in every speculator
    out = {}
    items = (obj.items() if isinstance(obj, dict) else enumerate(obj) if isinstance(obj, (list, tuple))
             else vars(obj).items() if hasattr(obj, "__dict__") else ())
    for k, v in items:
        out.update(tensors(v, f"{prefix}.{k}", seen, depth + 1))
    return out


def compare(a, b):
    ta, tb = tensors(a), tensors(b)
    rows = []
    for name in sorted(ta.keys() & tb.keys()):
        x, y = ta[name], tb[name]
        if x.shape != y.shape or x.dtype != y.dtype or x.device != y.device:
            continue
        if not torch.equal(x, y):
            d = (x.double() - y.double()).abs().max().item() if x.is_floating_point() else None
            rows.append((name, list(x.shape), str(x.dtype), int((x != y).sum()), d))
    return rows


if __name__ == "__main__":
    G.DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        targets = G.tiny_targets(Path(tmp))
        drafter = G.tiny_drafter(Path(tmp))
        llm = LLM(targets["qwen3"], device=G.DEVICE, dtype="float32", draft_model=drafter, spec="ddtree",
                  tree_budget="auto", time_stages=False)
        sps = [G.mixed_speculator(llm, None, capacity=1024) for _ in range(4)]
        out["after admission, 1st vs 2nd"] = compare(sps[0], sps[1])
        out["after admission, 2nd vs 3rd"] = compare(sps[1], sps[2])
        for sp in sps[:3]:
            sp.round(4, 64)
        out["after one round, 1st vs 2nd"] = compare(sps[0], sps[1])
        out["after one round, 2nd vs 3rd"] = compare(sps[1], sps[2])
    for k, v in out.items():
        print(k, "differing:", v[:12], flush=True)
    json.dump(out, open(sys.argv[1], "w"), indent=1)
