"""Kernels per stage of an eager round (CUDA; random weights at a real shape): how many launches each stage makes.

`kernel_profile.py` ranks a round's kernels by device time; this one says which stage launched them. On a GPU
where a round is launch-bound (SmolLM2-135M: ~400 kernels a round), a stage's launch count is what its time
follows. Rounds run eagerly (a CUDA graph replays the same kernels, but the profiler cannot tell a replay's
kernels apart); each stage is a `record_function` range opened and closed by the round's own `lap` calls, and
every profiled operator that launched kernels is put in the stage whose range holds it. Kernels that Triton
launches from Python (the splitkv attention, the tree builder, the walk) belong to no operator and are not in
these tables (on the H100 and H200 of benchmarks/h200-walk-kernel/); `kernel_profile.py` lists every kernel.
With `--device cpu` (a check of the script) it counts the operators each stage calls directly instead.

    python3 benchmarks/stage_kernels.py --shape smollm2-135m --methods none,ddtree:64 --out stages.txt
"""

from __future__ import annotations

import argparse
import collections
import sys

import torch
from torch.profiler import ProfilerActivity, profile, record_function

from kernel_profile import synthetic_pair
from treeflash import round as round_module
from treeflash.bench.methods import parse_methods
from treeflash.bench.timing import _filled_engine, _step, sync
from treeflash.engine import Engine
from treeflash.round import STAGES
from treeflash.sampling import SamplingParams


class AnnotatingClock:
    """A StageClock stand-in: a `record_function` range per stage, in the order `Speculator.round` laps them."""

    def __init__(self, device=None):
        self.order = iter(STAGES)
        self._open()

    def _open(self):
        stage = next(self.order, None)
        self.range = record_function(f"stage:{stage}") if stage else None
        if self.range is not None:
            self.range.__enter__()

    def lap(self, stage: str) -> None:
        if self.range is not None:
            self.range.__exit__(None, None, None)
        self._open()

    def seconds(self) -> dict[str, float]:
        return {}


def stage_table(prof, rounds: int, rows: int, cuda: bool = True) -> list[str]:
    """Per stage, the kernels (CUDA) or the operators called directly in the stage (elsewhere, to check the
    script: no kernels there) and their time, per round."""
    events = list(prof.events())
    ranges = [(e.name.split(":", 1)[1], e.time_range.start, e.time_range.end)
              for e in events if e.name.startswith("stage:")]
    kernels: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    times: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for e in events:
        if cuda:
            launched = [(f"{e.name[:40]} > {k.name[:70]}", k.duration) for k in e.kernels]
        else:
            parent = e.cpu_parent
            launched = [(e.name, e.cpu_time_total)] if parent is not None and parent.name.startswith("stage:") else []
        if not launched:
            continue
        start = e.time_range.start
        stage = next((name for name, a, b in ranges if a <= start <= b), "outside")
        for label, duration in launched:
            kernels[stage][label] += 1
            times[stage][label] += duration
    what = "kernels" if cuda else "operators"
    lines = []
    for stage in (*STAGES, "outside"):
        if stage not in kernels:
            continue
        count = sum(kernels[stage].values()) / rounds
        total = sum(times[stage].values()) / rounds
        lines.append(f"-- {stage}: {count:.1f} {what}, {total:.1f} us of {what} per round")
        for label, n in kernels[stage].most_common(rows):
            lines.append(f"   {n / rounds:6.1f}x {times[stage][label] / rounds:8.1f} us  {label}")
    return lines


def stage_tables(method, a, target, drafter, prompt, device: torch.device) -> str:
    """The stage table of `method`'s eager rounds (an engine with `a.batch` slots at `a.context` rows)."""
    params = SamplingParams(temperature=0.0, max_tokens=1 << 20, ignore_eos=True)
    new_tokens = (8 + a.rounds) * (drafter.config.block_size if method.spec != "none" else 1)
    engine, _ = _filled_engine(Engine, target, drafter if method.spec != "none" else None, method.spec_config(),
                               a.batch, prompt, params, new_tokens, 0, True, {"cuda_graphs": False})
    for _ in range(3):
        _step(engine, a.batch)
    sync(device)
    cuda = device.type == "cuda"
    with profile(activities=[ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])) as prof:
        for _ in range(a.rounds):
            _step(engine, a.batch)
        sync(device)
    return "\n".join([f"== {method.label} batch {a.batch} context {a.context} {a.shape} (eager rounds)",
                      *stage_table(prof, a.rounds, a.rows, cuda)])


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", default="smollm2-135m")
    p.add_argument("--methods", default="none,ddtree:64")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--context", type=int, default=1024)
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--rows", type=int, default=40, help="kernels listed per stage")
    p.add_argument("--device", default="cuda")
    p.add_argument("--out")
    a = p.parse_args(argv)
    device = torch.device(a.device)
    target, drafter, prompt = synthetic_pair(a.shape, device, a.context)
    clock, round_module.StageClock = round_module.StageClock, AnnotatingClock  # rounds lap their stages through it
    try:
        tables = []
        for method in parse_methods(a.methods):
            tables.append(stage_tables(method, a, target, drafter, prompt, device))
            print(tables[-1], flush=True)
    finally:
        round_module.StageClock = clock
    if a.out:
        with open(a.out, "w") as f:
            f.write("\n\n".join(tables) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
