"""Clocks for benchmarks: the device's copy bandwidth and the wall time of engine rounds.

On CUDA every measurement reads the clock after a synchronisation (an engine step ends with one: it
reads a round back), so a time covers the device work, not only the launches. Times are reported as
medians over repeats: the first calls (allocator warm-up, lazy initialisation) are run as warm-up and
thrown away.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field

import torch

from treeflash.engine import Engine, EngineConfig, Request
from treeflash.round import STAGES, SpecConfig, rows_per_round
from treeflash.sampling import SamplingParams


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
    round_ms: list[float]  # each timed step, without the per-stage clock
    stage_ms: dict[str, float] = field(default_factory=dict)  # mean per round, from a separate timed pass
    setup_s: float = 0.0  # admission + warm-up steps of the timed engine (compiles, graph captures)
    auto_budget: int | None = None  # tree_budget="auto": the budget chosen after the timed rounds

    @property
    def median_ms(self) -> float:
        return statistics.median(self.round_ms)

    def quantile_ms(self, q: float) -> float:
        ordered = sorted(self.round_ms)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def time_engine_rounds(target, drafter, spec: SpecConfig, batch: int, prompt: list[int], params: SamplingParams,
                       rounds: int, warmup: int = 2, stage_rounds: int = 3, seed: int = 0,
                       make_engine=Engine, **engine_options) -> tuple[RoundTiming, float]:
    """Wall time of `Engine.step()` with `batch` requests running, each with len(prompt) committed rows.

    A step is one round over every slot plus the engine's one host synchronisation (it reads the
    emitted tokens back), so this is the per-round cost a user sees, through whatever fast path the
    engine takes (CUDA graphs, kernels, overlapped rounds). Steps run back to back, as a serving loop
    runs them, and each is timed from the end of the one before (with overlap a step launches its round
    and then reads the previous one back, so only back to back does the host's work hide behind the
    device's; a synchronisation before each step would idle the device during every launch). The first
    step admits the requests (batched prefill forwards); `warmup` steps follow untimed (graph capture,
    allocator). The stage split comes from a second engine with the per-stage clock on, whose extra
    synchronisations would inflate the round times.
    make_engine: builds each engine from (target, drafter, spec, tokenizer, EngineConfig); a
    tensor-parallel group's builds every rank's and returns rank 0's, whose clock is read (the ranks run
    in lockstep). `engine_options`: further EngineConfig fields (compile_kernels, flex_decode_tokens, ...).
    Returns the timing (with `setup_s`: admission + warm-up, i.e. compiles and graph captures) and the
    mean prefill seconds of a request (the forwards it took part in).
    """
    device = target.embed_tokens.weight.device
    # Accepted drafts + the bonus, at most: a tree path and, grafted below it, the prompt lookup's chain (a
    # random model loops, and lookup then accepts all of it).
    most_per_round = (drafter.config.block_size if drafter is not None else 1) + spec.ngram_tokens
    # Steps per engine: admission (first token + a round), warm-up, timed; never let a request finish.
    new_tokens = (4 + warmup + max(rounds, stage_rounds)) * most_per_round
    begin = time.perf_counter()
    engine, prefill = _filled_engine(make_engine, target, drafter, spec, batch, prompt, params, new_tokens, seed,
                                     False, engine_options)
    for _ in range(warmup):
        _step(engine, batch)
    sync(device)
    setup_s = time.perf_counter() - begin
    times = []
    last = time.perf_counter()
    for _ in range(rounds):
        _step(engine, batch)
        now = time.perf_counter()
        times.append(1e3 * (now - last))
        last = now
    sync(device)
    auto = engine.budget.choose(engine.runner.bucket(batch)) if engine.budget is not None else None
    del engine
    timing = RoundTiming(times, setup_s=setup_s, auto_budget=auto)
    if stage_rounds:
        engine, _ = _filled_engine(make_engine, target, drafter, spec, batch, prompt, params, new_tokens, seed,
                                   True, engine_options)
        _step(engine, batch)  # warm-up (on a GPU: the capture of the per-stage graphs)
        first = engine.slots[0].metrics
        before = dict(first.stage_seconds)
        for _ in range(stage_rounds):
            _step(engine, batch)
        timing.stage_ms = {s: 1e3 * (first.stage_seconds.get(s, 0.0) - before.get(s, 0.0)) / stage_rounds
                           for s in STAGES if s in first.stage_seconds}
        del engine
    return timing, prefill


def _filled_engine(make_engine, target, drafter, spec, batch, prompt, params, new_tokens, seed, time_stages,
                   options=None):
    """An engine whose `batch` slots all hold a request with `prompt` prefilled (and its first round run)."""
    max_len = len(prompt) + new_tokens
    engine = make_engine(target, drafter, spec, None, EngineConfig(
        max_num_seqs=batch, max_model_len=max_len, time_stages=time_stages,
        min_capacity=max_len + rows_per_round(spec, drafter) + 1,  # no cache growth while timing
        # Every prompt in the first step: the engine otherwise prefills one chunk per step, and the
        # timed steps would carry the prefill of the slots admitted last.
        prefill_chunk=max(1, batch * len(prompt)), **(options or {})))
    requests = [Request(id=i, prompt=None, prompt_ids=list(prompt), params=params, seed=seed + i,
                        stop_ids=frozenset(), max_new_tokens=new_tokens) for i in range(batch)]
    for r in requests:
        engine.add(r)
    _step(engine, batch)  # admits every request (prefill + first token), then runs one round
    if not all(r.running for r in requests):
        raise RuntimeError("the benchmark's engine did not prefill every prompt in its first step")
    return engine, sum(r.metrics.prefill_seconds for r in requests) / batch


def _step(engine, batch: int) -> None:
    engine.step()
    running = sum(r is not None for r in engine.slots)
    if running != batch:  # every slot must stay busy, or the batch being timed is not `batch`
        raise RuntimeError(f"{batch - running} of {batch} requests finished while rounds were timed")
