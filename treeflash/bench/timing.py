"""Clocks for benchmarks: the device's copy bandwidth and the wall time of speculative rounds.

On CUDA every measurement synchronises before reading the clock, so a time covers the device work,
not only the launches. Times are reported as medians over repeats: the first calls (allocator
warm-up, lazy initialisation) are run as warm-up and thrown away.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field

import torch

from treeflash.round import STAGES, Speculator
from treeflash.sampling import SamplingTensors


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def copy_bandwidth(device: torch.device, nbytes: int | None = None, repeats: int = 10) -> float:
    """Bytes per second moved by a device-to-device copy, counting the read and the write.

    A decode step is bound by reading the weights once, so weight bytes / this bandwidth is the floor
    of a step on this device. 1 GiB on CUDA (well past the caches), 64 MiB on the CPU.
    """
    nbytes = nbytes or ((1 << 30) if device.type == "cuda" else (64 << 20))
    src = torch.empty(nbytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    src.fill_(1)
    times = []
    for i in range(repeats + 2):
        sync(device)
        start = time.perf_counter()
        dst.copy_(src)
        sync(device)
        if i >= 2:
            times.append(time.perf_counter() - start)
    return 2 * nbytes / statistics.median(times)


@dataclass
class RoundTiming:
    round_ms: list[float]  # each timed round, unsynchronised stages
    stage_ms: dict[str, float] = field(default_factory=dict)  # mean per round, from a separate timed pass

    @property
    def median_ms(self) -> float:
        return statistics.median(self.round_ms)

    def quantile_ms(self, q: float) -> float:
        ordered = sorted(self.round_ms)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def fill_slots(speculator: Speculator, batch: int, prompt: list[int]) -> float:
    """Prefill slot 0 with `prompt` and copy its cache rows to slots 1..batch-1; returns prefill seconds.

    Every slot then holds len(prompt) committed rows, so attention in a round reads what it would in
    a full batch, at the cost of one prefill instead of `batch`.
    """
    device = speculator.device
    sync(device)
    start = time.perf_counter()
    speculator.prefill(0, prompt)
    sync(device)
    seconds = time.perf_counter() - start
    caches = [speculator.cache] + ([speculator.draft_cache] if speculator.draft_cache is not None else [])
    with torch.inference_mode():
        for cache in caches:
            for t in (*cache.keys, *cache.values):
                t[1:batch].copy_(t[:1].expand(batch - 1, *t.shape[1:]))
        state = speculator.state
        state.seq_lens[:batch] = len(prompt)
        state.active[:batch] = True
        state.bonus[:batch] = prompt[-1]
    return seconds


def time_rounds(speculator: Speculator, batch: int, sampling: SamplingTensors, context: int,
                rounds: int, warmup: int = 2, stage_rounds: int = 3) -> RoundTiming:
    """Wall time of `rounds` rounds over `batch` slots holding `context` committed rows each.

    Each round is timed alone (synchronise, round, synchronise: the engine reads every round's tokens
    back, so rounds never overlap in use). After each round the slots are rewound to `context` rows,
    so every round sees the same cache length. The stage split comes from a separate pass with the
    per-stage clock on, whose extra synchronisations would otherwise inflate the round times.
    """
    device = speculator.device
    state = speculator.state

    def one_round(stages: bool):
        speculator.time_stages = stages
        sync(device)
        start = time.perf_counter()
        result = speculator.round(batch, sampling, context)
        sync(device)
        elapsed = time.perf_counter() - start
        with torch.inference_mode():
            state.seq_lens[:batch] = context
        return elapsed, result.stage_seconds

    for _ in range(warmup):
        one_round(False)
    timing = RoundTiming([1e3 * one_round(False)[0] for _ in range(rounds)])
    totals: dict[str, float] = {}
    for _ in range(stage_rounds):
        for stage, seconds in one_round(True)[1].items():
            totals[stage] = totals.get(stage, 0.0) + seconds
    speculator.time_stages = False
    timing.stage_ms = {s: 1e3 * totals[s] / stage_rounds for s in STAGES if s in totals}
    return timing
