"""CUDA graphs for the round: capture `Speculator.round` once per key, replay it every round.

The runner wraps the round, it does not fork it: a graph is the eager round recorded once. Keys are
(batch bucket, method, budget, sampling flags). A round over `n` running slots replays the graph of
the smallest bucket >= n (the slots past n hold no request and run along inactive, as they do
eagerly); with no graph for it (CPU, graphs off, a batch past the largest bucket) the round runs
eagerly. Graphs are captured lazily, at a key's first use, with a one-line message on stderr.

Static buffers: everything a graph reads lives at a fixed address for its life: the slot state
(seq_lens, bonus, active), the per-slot sampling rows, the caches. What it writes is kept in a
`Captured` record. The engine reads the read-back rows after the replay (with overlap, from a copy
queued behind it, since the next replay of that graph rewrites them), in the round's one host
synchronisation.

Memory: every graph is recorded on one stream into one shared pool, so each capture reuses the blocks
the captures before it freed: the pool holds about the largest graph's intermediates, not the sum of
all of them (a server's 207 graphs at 32 slots of SmolLM2: 10.8 GiB against 46.8 with a stream per
capture, 5.8 since top_p sorts in groups of rows, benchmarks/h200-graph-pool; 29 graphs at two slots:
0.43 against 1.92). The price is that a replay may overwrite any block another graph freed
while it was captured, so what a graph writes for the host is written outside the pool: the read-back
rows and a prefill's first tokens live in buffers of their own (`readback_out`, `out`), allocated
before the capture, and no replay of another graph touches them. The rest of a replay's outputs (the
tree, the walk, the predicted acceptance) stay in the pool and are valid only until the next replay of
any graph: read them right after the round, as `record_trees` does (which turns overlap off) and as
the GPU checks do. Tensors a round makes once and keeps (the tree builder's cached index tensors) are
made by the warm-up rounds that run before each capture, outside the pool.

Prefill too: `prefill` pads a forward's prompt pieces to powers of two (pieces, tokens, cache rows
attended) and replays that shape's graph (one per sampling flags: it also commits each slot's length
and draws each finished prompt's first token, `Speculator.prefill_and_start`); its static inputs are
the pieces' tokens, starts, lengths, slots and whether each ends its prompt. An eager prefill forward
is launch-bound on a GPU (thousands of small kernels for a prompt of a hundred tokens), so this is what
makes a request's first token cheap. Padding tokens are
stored at rows past their slot's new length (nothing reads them before they are overwritten); padding
pieces repeat the first piece. Larger forwards (`PREFILL_GRAPH_ELEMENTS`), continuations that would
write past the cache's end, and the CPU run the same `prefill_and_start` eagerly. A prefill graph keeps
its pieces' logits ([K, V], K the padded pieces) in the shared pool, as round graphs keep their nodes'.

Cache growth (`Speculator.reserve`) replaces the cache tensors: the runner notices and drops every
graph (they are captured again at next use). Caches double when they grow, so this is rare.
The caches are the speculator's, not the graphs'; the largest round's intermediates are dominated by
the float32 logits of every tree node (e.g. 1.25 GB for batch 8 x 257 nodes x a 152k vocabulary).

Hazards (NOTE): warm-up before capture runs the round for real, so it saves and restores the slot
state (rows it writes lie past every slot's committed length, where later rounds overwrite them);
nothing inside a captured round may read a device value on the host.
"""

from __future__ import annotations

import dataclasses
import gc
import sys
import time
from dataclasses import dataclass
from typing import Callable

import torch

from treeflash.round import STAGES, PrefillBatch, PrefillPiece, RoundResult, StageClock, Speculator

PREFILL_MIN_TOKENS = 16  # the shortest piece length a prefill graph is captured for
# A prefill graph's intermediates grow with its tokens x the model's hidden size (the pool keeps the
# largest): past this many elements (32M: 8k tokens of an 8B model, 32k of SmolLM2) a forward's own
# work dwarfs its launches, and it runs eagerly.
PREFILL_GRAPH_ELEMENTS = 1 << 25


def default_buckets(max_slots: int) -> tuple[int, ...]:
    """Powers of two below max_slots, and max_slots itself."""
    sizes, n = {max_slots}, 1
    while n < max_slots:
        sizes.add(n)
        n *= 2
    return tuple(sorted(sizes))


def _log(message: str) -> None:
    print(f"treeflash: {message}", file=sys.stderr, flush=True)


@dataclass
class Captured:
    """One key's graph(s) and the output tensors their replays write."""

    graphs: list  # torch.cuda.CUDAGraph: one, or one per stage when stages are timed
    stages: list[str]  # the stage each graph ends with (timed capture only)
    # Written in place by every replay. Its read-back lies outside the pool; its tree, walk and predicted
    # acceptance inside it, valid until the next replay of any graph (see the module's docstring).
    result: RoundResult


@dataclass
class PrefillGraph:
    """One prefill key's graph (`Speculator.prefill_and_start`): replays read `batch` and write `first`
    (each piece's first-token draw and any log-probs of it, [K, 1 (+ L)], a buffer outside the pool) in place."""

    graph: object  # torch.cuda.CUDAGraph
    batch: PrefillBatch
    first: torch.Tensor


def _pow2(n: int) -> int:
    return 1 << (n - 1).bit_length()


class _Capture:
    """Records the round on `stream` (the runner's one side stream: see the module's docstring on memory);
    with `split`, one graph per stage (ends at each lap), each adding 1 to `touch`, which the caller keeps
    alive as long as the graphs."""

    def __init__(self, pool, split: bool, stream: torch.cuda.Stream, touch: torch.Tensor | None = None):
        self.pool, self.split, self.stream, self.touch = pool, split, stream, touch
        self.graphs: list = []
        self.stages: list[str] = []

    def __enter__(self) -> "_Capture":
        torch.cuda.synchronize()
        # No garbage collection inside a capture (a finalizer there could free or sync what the capture
        # forbids). No full collection before it either: with Inductor's and Dynamo's objects alive it cost
        # ~0.2 s a graph on the H200, ~40 s of a server's 207 (benchmarks/h200-capture-cost).
        self._gc = gc.isenabled()
        gc.disable()
        try:
            self.stream.wait_stream(torch.cuda.current_stream())
            self._ctx = torch.cuda.stream(self.stream)
            self._ctx.__enter__()
            self._begin()
        except BaseException:
            if self._gc:
                gc.enable()
            raise
        return self

    def _begin(self) -> None:
        graph = torch.cuda.CUDAGraph()
        graph.capture_begin(pool=self.pool)
        self.graphs.append(graph)

    def lap(self, stage: str) -> None:
        if not self.split:
            return
        self.touch.add_(1)  # one kernel per stage graph: a stage without kernels (AR's draft) is not empty
        self.graphs[-1].capture_end()
        self.stages.append(stage)
        if stage != STAGES[-1]:  # nothing with kernels follows the last stage
            self._begin()

    def __exit__(self, *exc) -> None:
        try:
            if not self.split or len(self.stages) < len(self.graphs):
                self.graphs[-1].capture_end()
        finally:
            self._ctx.__exit__(*exc)
            torch.cuda.current_stream().wait_stream(self.stream)
            if self._gc:
                gc.enable()


class GraphRunner:
    """Runs rounds for the engine: graph replay on CUDA, the eager round otherwise.

    enabled: use CUDA graphs (ignored off CUDA). time_stages: capture one graph per stage and time
    each with CUDA events (RoundResult.stage_seconds, read after the sync); otherwise one graph.
    """

    def __init__(self, speculator: Speculator, enabled: bool = True, time_stages: bool = False,
                 buckets: tuple[int, ...] | None = None, log: Callable[[str], None] | None = _log):
        self.speculator = speculator
        self.enabled = enabled and speculator.device.type == "cuda"
        self.time_stages = time_stages
        self.buckets = buckets or default_buckets(speculator.slots)
        if max(self.buckets) > speculator.slots:
            raise ValueError(f"batch buckets {self.buckets} exceed the speculator's {speculator.slots} slots")
        self.log = log
        self.graphs: dict[tuple, Captured] = {}
        self.prefill_graphs: dict[tuple, PrefillGraph] = {}  # (padded shape, sampling flags)
        self.pool = None
        # The stream every capture and its warm-up run on: one for all, as the allocator reuses a freed block
        # on the stream that freed it alone. A new stream per warm-up kept each one's blocks reserved: measuring
        # the auto budget at batch 32 on an H200 held ~80 GiB that no one used and then ran out of memory
        # (benchmarks/h200-serve); a new stream per capture kept each graph's intermediates to itself.
        self._side: torch.cuda.Stream | None = None
        self._cache_ptr = None
        # What every stage graph's one kernel writes (see _Capture.lap). It lives as long as the graphs that
        # write it: made outside the pool, a tensor freed after its capture gives its block to the next
        # allocation, and each replay would add 1 to whatever tensor holds it then.
        self._touch: torch.Tensor | None = None

    def bucket(self, num_slots: int) -> int:
        """The batch size a round over `num_slots` slots runs at (num_slots itself past the buckets)."""
        return next((b for b in self.buckets if b >= num_slots), num_slots)

    def key(self, bucket: int, budget: int | None) -> tuple:
        sp = self.speculator
        budget = sp.budget(budget) if sp.spec.method == "ddtree" else 0
        return (bucket, sp.spec.method, budget, sp.flags)

    def round(self, num_slots: int, budget: int | None = None, kv_rows: int | None = None) -> RoundResult:
        """One round over slots [0, num_slots): a replay when a graph fits, else the eager round (over
        `kv_rows` cache rows where given: `Speculator.round`; a graph spans the whole cache)."""
        bucket = self.bucket(num_slots)
        if not self.enabled or bucket not in self.buckets:
            return self.speculator.round(num_slots, budget, kv_rows=kv_rows)
        captured = self.graph(bucket, budget)
        if not captured.stages:
            captured.graphs[0].replay()
            return captured.result
        clock = StageClock(self.speculator.device)
        for graph, stage in zip(captured.graphs, captured.stages):
            graph.replay()
            clock.lap(stage)
        return dataclasses.replace(captured.result, clock=clock)

    def time_round(self, num_slots: int, budget: int | None = None, repeats: int = 5) -> float:
        """Median seconds of a round over `num_slots` slots (the slots' state is restored after)."""
        sp = self.speculator
        saved = _save(sp)
        times = []
        try:
            for i in range(repeats + 1):  # the first one warms up (and captures)
                _restore(sp, saved)
                if self.enabled and self.bucket(num_slots) in self.buckets:
                    captured = self.graph(self.bucket(num_slots), budget)
                    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    start.record()
                    for graph in captured.graphs:
                        graph.replay()
                    end.record()
                    end.synchronize()
                    seconds = start.elapsed_time(end) / 1e3
                else:
                    begin = time.perf_counter()
                    sp.round(num_slots, budget, clock=_NoClock())
                    if sp.device.type == "cuda":
                        torch.cuda.synchronize()
                    seconds = time.perf_counter() - begin
                if i:
                    times.append(seconds)
        finally:
            _restore(sp, saved)
        return sorted(times)[len(times) // 2]

    def prefill_shape(self, pieces: list[PrefillPiece]) -> tuple[int, int, int] | None:
        """The (pieces, tokens per piece, cache rows attended) a prefill graph runs `pieces` at: each a
        power of two at least the real one; None where they prefill eagerly (too large, or padding
        would write past the cache's end)."""
        sp = self.speculator
        num = _pow2(len(pieces))
        length = max(PREFILL_MIN_TOKENS, _pow2(max(p.end - p.start for p in pieces)))
        start = max(p.start for p in pieces)
        if start + length > sp.capacity or num * length * sp.target.config.hidden_size > PREFILL_GRAPH_ELEMENTS:
            return None
        return num, length, min(_pow2(start + length), sp.capacity)

    def prefill(self, pieces: list[PrefillPiece], prompt_logprobs: bool = False) -> torch.Tensor:
        """`Speculator.prefill_and_start` of the pieces (forward, commit, each finished piece's first token,
        whose sampling row must be written first), replayed from a graph where one fits, one per (padded
        shape, sampling flags). Returns each piece's read-back [k, 1 (+ L)] on the device: its draw, then any
        log-probs of it (read nothing back here). prompt_logprobs: some piece's request asks for them; the
        pieces then run eagerly and each read-back ends in its positions' packed log-probs [T x COLUMNS]."""
        sp = self.speculator
        shape = self.prefill_shape(pieces) if self.enabled and not prompt_logprobs else None
        if shape is None:
            return sp.prefill_and_start(sp.prefill_batch(pieces), sp.attend_width(max(p.end for p in pieces)),
                                        sp.real_tokens(pieces),
                                        prompt_next=sp.prompt_next(pieces) if prompt_logprobs else None)
        self._check_cache()
        inputs = sp.prefill_batch(pieces, shape[0], shape[1])
        key = (shape, sp.flags)
        captured = self.prefill_graphs.get(key)
        if captured is None:
            captured = self.prefill_graphs[key] = self._capture_prefill(inputs, shape)
        else:
            captured.batch.copy_(inputs)
        captured.graph.replay()
        return captured.first[:len(pieces)]

    def reset(self) -> None:
        """Drop every graph (their memory returns to the allocator)."""
        if self.speculator.device.type == "cuda":
            torch.cuda.synchronize()  # a round may still be running from one of them (the engine's overlap)
        self.graphs.clear()
        self.prefill_graphs.clear()
        self.pool = self._side = None
        gc.collect()
        if self.enabled:
            torch.cuda.empty_cache()

    def _check_cache(self) -> None:
        sp = self.speculator
        ptr = (sp.cache.keys[0].data_ptr(), sp.structure.generation if sp.structure is not None else 0)
        if ptr != self._cache_ptr:  # new caches (reserve) or structure tables (grown): graphs point at the old
            self.reset()
            self._cache_ptr = ptr

    def graph(self, bucket: int, budget: int | None) -> Captured:
        self._check_cache()
        key = self.key(bucket, budget)
        if key not in self.graphs:
            self.graphs[key] = self._capture(bucket, budget, key)
        return self.graphs[key]

    def _side_stream(self) -> torch.cuda.Stream:
        if self._side is None:
            self._side = torch.cuda.Stream()
        return self._side

    def _capture(self, bucket: int, budget: int | None, key: tuple) -> Captured:
        sp = self.speculator
        start = time.perf_counter()
        if self.pool is None:
            self.pool = torch.cuda.graph_pool_handle()
        saved = _save(sp)
        # Warm-up on a side stream: compiles kernels (FlexAttention), creates library handles and
        # lets the allocator see every size before capture. It really runs: restore the state after.
        side = self._side_stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):
                warm = sp.round(bucket, budget, clock=_NoClock())
                _restore(sp, saved)
            rows = torch.empty_like(warm.readback)  # outside the pool: no other graph's replay writes it
        torch.cuda.current_stream().wait_stream(side)
        if self.time_stages and self._touch is None:
            self._touch = torch.zeros(1, device=sp.device)
        with _Capture(self.pool, self.time_stages, side, self._touch) as capture:
            result = sp.round(bucket, budget, clock=capture, readback_out=rows)
        torch.cuda.synchronize()
        if self.log:
            _, method, b, flags = key
            name = f"ddtree:{b}" if method == "ddtree" else method
            sampling = _sampling_name(flags)
            self.log(f"captured a CUDA graph for batch <= {bucket}, {name}, {sampling} "
                     f"({time.perf_counter() - start:.1f} s)")
        return Captured(capture.graphs, capture.stages, result)

    def _capture_prefill(self, inputs: PrefillBatch, shape: tuple[int, int, int]) -> PrefillGraph:
        """Capture `prefill_and_start` of `inputs` (which become the graph's static inputs) with the
        speculator's sampling flags now. The warm-up runs it for real: it writes the same rows, lengths
        and first tokens the replay that follows writes again."""
        sp = self.speculator
        start = time.perf_counter()
        if self.pool is None:
            self.pool = torch.cuda.graph_pool_handle()
        kv_len = shape[2]
        side = self._side_stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):
                drawn = sp.prefill_and_start(inputs, kv_len)
            first = torch.empty_like(drawn)  # outside the pool, as a round's read-back
        torch.cuda.current_stream().wait_stream(side)
        with _Capture(self.pool, False, side) as capture:
            sp.prefill_and_start(inputs, kv_len, out=first)
        torch.cuda.synchronize()
        if self.log:
            sampling = _sampling_name(sp.flags)
            self.log(f"captured a CUDA graph for prefill of {shape[0]} x {shape[1]} tokens, {sampling} "
                     f"({time.perf_counter() - start:.1f} s)")
        return PrefillGraph(capture.graphs[0], inputs, first)


def _sampling_name(flags) -> str:
    return ("greedy" if flags.all_greedy else "sampling") + (" with log-probs" if flags.logprobs else "")


class _NoClock:
    def lap(self, stage: str) -> None:
        pass


def _save(sp: Speculator) -> tuple:
    """What a warm-up round changes for real and must give back: the slots' lengths and roots, the
    generated-token counts penalties keep (a round adds what it emits), bad_words' recent tokens and the
    structured outputs' states."""
    counts = sp.penalty_counts.output.clone() if sp.penalty_counts is not None else None
    past = sp.bad_words.past.clone() if sp.bad_words is not None else None
    states = sp.structure.state.clone() if sp.structure is not None else None
    return sp.state.seq_lens.clone(), sp.state.bonus.clone(), counts, past, states


def _restore(sp: Speculator, saved: tuple) -> None:
    sp.state.seq_lens.copy_(saved[0])
    sp.state.bonus.copy_(saved[1])
    if saved[2] is not None:
        sp.penalty_counts.output.copy_(saved[2])
    if saved[3] is not None:
        sp.bad_words.past.copy_(saved[3])
    if saved[4] is not None:
        sp.structure.state.copy_(saved[4])
