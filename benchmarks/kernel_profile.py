"""Where a round's device time goes, kernel by kernel (CUDA; random weights at a real shape).

For each method, an engine with `--batch` slots at `--context` committed rows runs rounds under
torch.profiler, once replaying its CUDA graphs (what users get; the kernels inside a replay are listed
when CUPTI reports them) and once eagerly (every kernel named, launch gaps aside). Prints the top
kernels by device time per round, and writes the tables to --out.

    python3 benchmarks/kernel_profile.py --shape smollm2-135m --methods none,dflash,ddtree:64 --out prof.txt
"""

from __future__ import annotations

import argparse
import sys

import torch
from torch.profiler import ProfilerActivity, profile

from treeflash.bench.methods import parse_methods
from treeflash.bench.shapes import build_drafter, build_target, drafter_config, shape, target_config
from treeflash.bench.timing import _filled_engine, _step, sync
from treeflash.engine import Engine
from treeflash.sampling import SamplingParams


def profile_method(target, drafter, method, batch, prompt, rounds, graphs, rows, attention=None) -> str:
    spec = method.spec_config()
    params = SamplingParams(temperature=0.0, max_tokens=1 << 20, ignore_eos=True)
    new_tokens = (8 + rounds) * (drafter.config.block_size if method.spec != "none" else 1)
    engine, _ = _filled_engine(Engine, target, drafter if method.spec != "none" else None, spec, batch, prompt,
                               params, new_tokens, 0, False, {"cuda_graphs": graphs, "attention": attention})
    for _ in range(3):
        _step(engine, batch)
    device = target.embed_tokens.weight.device
    kernels = device.type == "cuda"  # the CPU (a smoke test) lists its operators instead
    sync(device)
    with profile(activities=[ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if kernels else [])) as prof:
        for _ in range(rounds):
            _step(engine, batch)
        sync(target.embed_tokens.weight.device)
    events = [e for e in prof.key_averages() if (e.device_time_total if kernels else e.self_cpu_time_total) > 0
              and (e.device_type.name == "CUDA") == kernels]
    time = (lambda e: e.device_time_total) if kernels else (lambda e: e.self_cpu_time_total)
    events.sort(key=lambda e: -time(e))
    total = sum(map(time, events)) / rounds
    lines = [f"== {method.label} batch {batch} {'graphs' if graphs else 'eager'} {attention or 'default'} attention: "
             f"{total / 1e3:.3f} ms of {'kernels' if kernels else 'operators'} per round"]
    for e in events[:rows]:
        lines.append(f"{time(e) / rounds:9.1f} us {e.count / rounds:6.1f}x  {e.key[:110]}")
    del engine
    return "\n".join(lines)


def synthetic_pair(name: str, device: torch.device, context: int):
    """The target and drafter of shape `name` with random weights (bf16 on CUDA, float32 elsewhere), and a random
    prompt of `context` tokens."""
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    s = shape(name)
    tcfg = target_config(s)
    dcfg = drafter_config(tcfg, s.drafter_layers, s.block_size, s.mask_token_id, s.target_layer_ids)
    target = build_target(tcfg, device, dtype, seed=0)
    drafter = build_drafter(dcfg, device, dtype, seed=1)
    prompt = torch.randint(0, tcfg.vocab_size, (context,), generator=torch.Generator().manual_seed(0)).tolist()
    return target, drafter, prompt


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", default="smollm2-135m")
    p.add_argument("--methods", default="none,dflash,ddtree:64")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--context", type=int, default=512)
    p.add_argument("--rounds", type=int, default=20)
    p.add_argument("--rows", type=int, default=30)
    p.add_argument("--modes", default="graphs,eager")
    p.add_argument("--device", default="cuda")
    p.add_argument("--attention", default=None, help="sdpa, flex, splitkv or hybrid (default: the device's)")
    p.add_argument("--out")
    a = p.parse_args(argv)
    target, drafter, prompt = synthetic_pair(a.shape, torch.device(a.device), a.context)
    out = []
    for method in parse_methods(a.methods):
        for mode in a.modes.split(","):
            text = profile_method(target, drafter, method, a.batch, prompt, a.rounds, mode == "graphs", a.rows,
                                  a.attention)
            print(text, flush=True)
            out.append(text)
    if a.out:
        with open(a.out, "w") as f:
            f.write("\n\n".join(out) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
