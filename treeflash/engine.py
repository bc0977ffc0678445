"""The engine: requests in slots, one round per step, emitted tokens cut exactly at stops.

The engine is long-lived: `LLM` builds one, and every call (and `treeflash serve`) feeds it requests.
`Engine.step()` admits waiting requests into free slots (prefill + first token), runs one round over
the running slots (a CUDA graph replay on a GPU, treeflash/runner.py), reads the emitted tokens back
(the round's only host synchronisation) and finishes requests whose tokens hit a stop token, a stop
string, max_tokens or the context limit. With tree_budget="auto" each round's budget is chosen from
the cost profile and the recent acceptance (treeflash/budget.py), using only what that sync read.
`Engine.abort()` ends a request at once, waiting or running, and frees its slot.

Overlap (`EngineConfig.overlap`, on where rounds are CUDA graph replays): a step launches its round
*before* reading the previous one back, so the host's bookkeeping of one round (stops, text, the
budget's averages, the next launch) runs while the device computes the next, and the device does not
wait for the host between rounds. The round launched that way runs for every request still running
on the host's last word, so a request that the round being read turns out to finish has one more
round computed for it, whose tokens are thrown away; its slot is released after that round on the
device's stream, before anything else can use it. Tokens do not change: a round's tokens depend only
on the slot's device state, and every request's tokens are cut on the host exactly as before.

Prefill is interleaved with the rounds: a step prefills at most `prefill_tokens_per_step` prompt tokens
(default: one chunk of `prefill_chunk`), so newcomers delay the running requests by at most that much.
A long prompt is cut into chunks of `prefill_chunk` and takes a step per chunk; the pieces of one step
(several requests' prompts or chunks) run through the target together, in a few padded forwards
(each a CUDA graph replay on a GPU where its padded shape fits, treeflash/runner.py).
Text is detokenised incrementally as tokens arrive; `text_delta` hands out the part of it
that can no longer change (one implementation for `LLM.stream` and the server).
"""

from __future__ import annotations

import hashlib
import heapq
import json
import time
from collections import deque
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import torch

from treeflash.attention import FLEX_DECODE_TOKENS
from treeflash.budget import AUTO_BUDGETS, NO_DRAFT, BudgetChooser, CostProfile, auto_budget_limit
from treeflash.detokenize import IncrementalDetokenizer
from treeflash.gguf_convert import default_cache_dir
from treeflash.logprobs import COLUMNS, Logprob, TokenPieces, unpack
from treeflash.outputs import RequestMetrics, RequestOutput
from treeflash.prefix_reuse import PrefixReuse
from treeflash.provenance import source_digest
from treeflash.round import PREDICTED_SCALE, PREFILL_CHUNK, PrefillPiece, RoundResult, SpecConfig, Speculator, \
    rows_per_round
from treeflash.runner import PREFILL_MIN_TOKENS, GraphRunner
from treeflash.sampling import SamplingParams
from treeflash.structured import Grammar
from treeflash.tree_view import render_tree


@dataclass
class Request:
    id: int
    prompt: str | None
    prompt_ids: list[int]
    params: SamplingParams
    seed: int
    stop_ids: frozenset[int]
    max_new_tokens: int  # max_tokens, or fewer when the context limit comes first
    output_ids: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    stop_string_at: int | None = None  # cut the text here when a stop string ended the request
    stop_reason: int | str | None = None  # the stop string or stop token id that ended it (None: EOS, length)
    slot: int | None = None
    prefilled: int = 0  # prompt tokens already in the slot's caches; running once all are
    detok: IncrementalDetokenizer | None = None  # the generated text, grown token by token
    metrics: RequestMetrics = field(default_factory=RequestMetrics)
    last_tree: str | None = None
    # params.logprobs set: one {token id: Logprob} per output token (treeflash/logprobs.py), else None
    logprobs: list[dict[int, Logprob]] | None = None
    # params.prompt_logprobs set: None for the first prompt token, then one entry per prompt token prefilled
    prompt_logprobs: list[dict[int, Logprob] | None] | None = None
    bad_words_ids: list[list[int]] | None = None  # params.bad_words as token sequences (treeflash/bad_words.py)
    grammar: Grammar | None = None  # params.structured_outputs as a token automaton (treeflash/structured.py)
    choice: int = 0  # which of its prompt's SamplingParams.n completions this request makes
    waits_for_copy: bool = False  # its next chunk was prefilled by another request: taken from that slot next step

    def __post_init__(self) -> None:
        if self.params.logprobs is not None and self.logprobs is None:
            self.logprobs = []
        if self.params.prompt_logprobs is not None and self.prompt_logprobs is None:
            self.prompt_logprobs = [None]

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    @property
    def running(self) -> bool:
        return self.slot is not None and self.prefilled == len(self.prompt_ids)


@dataclass
class StepUpdate:
    request: Request
    new_token_ids: list[int]


@dataclass
class Launched:
    """A round launched and not yet read back: the requests it ran for (by slot) and where its
    read-back lands (on CUDA a pinned host buffer filled by a copy queued after the round, ready when
    `ready` has passed; elsewhere the round's own tensor)."""

    requests: list[tuple[int, "Request"]]
    budget: int | None
    result: RoundResult
    rows: torch.Tensor
    ready: torch.cuda.Event | None
    start: float  # host clock at launch


@dataclass
class EngineStats:
    """Running totals since the engine was built: where a busy engine's time goes (host clock; the
    seconds include the GPU work each part waits for at its synchronisation)."""

    steps: int = 0
    rounds: int = 0
    round_seconds: float = 0.0  # rounds, their sync and the host bookkeeping of their tokens
    prefill_forwards: int = 0
    prefill_tokens: int = 0
    prefill_seconds: float = 0.0  # prefill forwards and first-token draws
    generated_tokens: int = 0
    reused_prompt_tokens: int = 0  # prompt tokens whose rows an earlier prompt's prefill left (prefix reuse)


# 4, 8, 16: a prefix, as BudgetChooser's columns require. On a 2-core CPU with the shipped pair, budget 32
# ran at 0.76x plain decoding against 0.90-1.05x for 4-16 (results/smollm2_drafter_v3/cpu_speed*.json),
# and measuring 32 and 64 took most of the seconds a first call spent measuring.
EAGER_AUTO_BUDGETS = AUTO_BUDGETS[:3]


@dataclass(frozen=True)
class EngineConfig:
    max_num_seqs: int = 8  # slots: requests that run side by side
    max_model_len: int = 2048  # prompt + generated tokens of one request
    time_stages: bool = True  # time each round's stages (synchronises on a GPU)
    record_trees: bool = False  # keep each request's last draft tree, drawn
    # Caches start this long (rounded to whole attention blocks: 512 on the CPU) and double as requests need.
    min_capacity: int = 256
    cuda_graphs: bool = True  # replay rounds as CUDA graphs (CUDA only; the CPU always runs eagerly)
    # Batch sizes captured as graphs (a round over n slots replays the smallest >= n); None: powers of
    # two up to max_num_seqs. Each capture costs seconds (kernels compiled for its shape); one large
    # size suits a throughput job whose slots are always nearly full.
    cuda_graph_sizes: tuple[int, ...] | None = None
    attention: str | None = None  # "sdpa", "flex", "splitkv", "hybrid" (treeflash/attention.py); None: the default
    # tree_budget="auto": the CostProfile (JSON) to load, or to write once measured. None: with CUDA graphs, a
    # file of the treeflash cache named after everything the costs depend on (`default_budget_profile`), so
    # the measurement runs once per machine, model shapes and code; eagerly (the CPU), none. False: measure
    # in every process and store nothing.
    budget_profile: str | bool | None = None
    prefill_chunk: int = PREFILL_CHUNK  # a long prompt is prefilled in chunks of this many tokens, one per step
    # Prompt tokens prefilled per step at most, over all requests (None: prefill_chunk). Larger admits
    # many requests per step (throughput: filling hundreds of slots); smaller keeps rounds steady.
    prefill_tokens_per_step: int | None = None
    compile_kernels: bool = True  # CUDA: fused projections + compiled pieces (models/kernels.py); False: eager
    flex_decode_tokens: int = FLEX_DECODE_TOKENS  # FlexAttention's decoding kernel up to this many new tokens
    # CUDA: DDTree's builder as one Triton kernel (treeflash/tree_kernel.py) instead of torch ops; same trees.
    # None: where it measured faster (round.use_tree_kernel: budget <= 256 at 15 depths); True/False: always/never.
    # The walk and the verify mask likewise (treeflash/walk_kernel.py), unless False.
    tree_kernel: bool | None = None
    # Newcomers are admitted only once this many slots are free (or all waiting requests fit, or no
    # slot is busy). Every admission costs an eager prefill forward and a first-token draw; with
    # hundreds of slots and requests ending a few per step, 1 pays that on almost every step. A larger
    # value admits in batches (throughput: data generation), leaving up to this many slots idle a while.
    admit_batch: int = 1
    # Use the drafter's draft vocabulary (draft_vocab.json beside its weights) when it ships one: its lm_head
    # then covers those tokens only. Output is the same either way; only what the drafter can propose changes.
    draft_vocab: bool = True
    # CPU: float32 projections (and bfloat16 ones, where the CPU has bfloat16 products) through oneDNN's prepacked
    # weights (models/kernels.linear; a second copy of the weights in memory); False: F.linear, which packs the
    # weight again at every call.
    cpu_prepack: bool = True
    # Launch each round before reading the last one back (see the module docstring). None: where rounds run
    # asynchronously to the host and nothing reads a round's device tensors after it (CUDA graphs, no stage
    # clock, no recorded trees); True: also otherwise (eagerly it only costs, but the tests check the
    # bookkeeping on the CPU with it); False: never. The tokens are the same in every case.
    overlap: bool | None = None
    # A prompt's whole prefill chunks that a slot's caches still hold (an earlier prompt's, in its slot or
    # another) are taken instead of prefilled again (treeflash/prefix_reuse.py); False: every prompt is
    # prefilled from its first token.
    prefix_reuse: bool = True

    def __post_init__(self) -> None:
        if self.budget_profile is True or not isinstance(self.budget_profile, (str, Path, bool, type(None))):
            raise ValueError(f"budget_profile must be a file path, None (on CUDA, a file in the treeflash cache) or "
                             f"False (keep none), got {self.budget_profile!r}")
        for name in ("prefill_chunk", "prefill_tokens_per_step", "admit_batch"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        sizes = self.cuda_graph_sizes
        if sizes is not None and not (isinstance(sizes, tuple) and sizes and all(
                isinstance(n, int) and not isinstance(n, bool) and 1 <= n <= self.max_num_seqs for n in sizes)):
            raise ValueError(f"cuda_graph_sizes must be batch sizes in [1, max_num_seqs={self.max_num_seqs}], "
                             f"got {sizes!r}")

    @property
    def prefill_budget(self) -> int:
        return self.prefill_chunk if self.prefill_tokens_per_step is None else self.prefill_tokens_per_step


class Engine:
    """Owns the speculator (caches sized by the engine, grown on demand) and the request slots."""

    def __init__(self, target, drafter, spec: SpecConfig, tokenizer, config: EngineConfig):
        self.config, self.tokenizer = config, tokenizer
        self.pieces = TokenPieces(tokenizer)  # each token's own text (log-prob entries), memoised
        graphs = config.cuda_graphs and target.embed_tokens.weight.device.type == "cuda"  # (GraphRunner.enabled)
        # Rows a request can ever need: its whole context, plus what one round writes past it (eagerly the
        # automatic budget weighs only EAGER_AUTO_BUDGETS: `_budget_chooser`).
        self.round_rows = rows_per_round(spec, drafter, max(EAGER_AUTO_BUDGETS) if spec.auto and not graphs else None)
        self.overlap = (graphs and not config.time_stages and not config.record_trees) if config.overlap is None \
            else config.overlap
        # Rows a slot's caches need past its request's last token: one round's, and with overlap a second
        # round's (the one launched before the host knew the request had finished).
        self.spare_rows = self.round_rows * (2 if self.overlap else 1)
        self.max_capacity = config.max_model_len + self.spare_rows + 1
        self.speculator = Speculator(target, drafter, spec, config.max_num_seqs,
                                     capacity=min(config.min_capacity, self.max_capacity),
                                     time_stages=config.time_stages, attention=config.attention,
                                     flex_decode_tokens=config.flex_decode_tokens, tree_kernel=config.tree_kernel,
                                     compile_kernels=config.compile_kernels, draft_vocab=config.draft_vocab,
                                     cpu_prepack=config.cpu_prepack)
        self.max_capacity = self.speculator.rounded(self.max_capacity)  # (whole attention blocks, as it grows)
        self.floor_capacity = self.speculator.capacity  # what idle eager caches shrink back to (`reserve_all`: all)
        sizes = tuple(sorted(set(config.cuda_graph_sizes))) if config.cuda_graph_sizes else None
        self.runner = GraphRunner(self.speculator, enabled=config.cuda_graphs, time_stages=config.time_stages,
                                  buckets=sizes)
        self.budget = self._budget_chooser(config) if spec.auto else None
        self.record_trees = config.record_trees
        self.in_flight: Launched | None = None  # the round launched and not yet read back (overlap)
        self._accounted = 0.0  # host clock up to which time went to a request's prefill or rounds
        # Two pinned read-back buffers per shape, used in turn: one may still be read while the next
        # round's copy is queued into the other.
        self._pinned: dict[tuple[int, ...], list[tuple[torch.Tensor, torch.cuda.Event]]] = {}
        self._turn = 0
        self.slots: list[Request | None] = [None] * config.max_num_seqs
        self.free = list(range(config.max_num_seqs))  # a heap of free slots: the lowest is taken first
        self.freed: list[int] = []  # slots retired this step, released on the device together (`_release`)
        self.seq_lens = [0] * len(self.slots)  # host copy, known after each round's one sync
        self.waiting: deque[Request] = deque()
        self.started: list[Request] = []  # requests given a slot, in that order (some may be running now)
        self._prefixes: PrefixReuse | None = None  # (`prefixes`)
        self.stats = EngineStats()

    def _budget_chooser(self, config: EngineConfig) -> BudgetChooser:
        sp = self.speculator
        device = torch.cuda.get_device_name(sp.device) if sp.device.type == "cuda" else "cpu"
        # Eager (CPU) rounds cost in proportion to their nodes, so large budgets never pay there, and
        # measuring them at a large batch takes minutes: eagerly, only the first few are candidates.
        eager = not self.runner.enabled
        if config.budget_profile is None and not eager:
            path = default_budget_profile(self)
        else:
            path = Path(config.budget_profile) if config.budget_profile else None
        profile = CostProfile.load(path) if path and path.is_file() else CostProfile(device)
        if profile.device != device:
            raise ValueError(f"{path}: a cost profile measured on {profile.device!r}, this is {device!r}")
        budgets = EAGER_AUTO_BUDGETS if eager else AUTO_BUDGETS
        limits: dict[int, int] = {}

        def max_budget(bucket: int) -> int:
            # Fixed when a bucket is first weighed, from the memory free then (after a warm-up has grown the
            # caches and captured the smaller buckets' graphs): asked every round, the device would be too.
            if bucket not in limits:
                free = torch.cuda.mem_get_info(sp.device)[0] if sp.device.type == "cuda" else None
                limits[bucket] = auto_budget_limit(bucket, sp.target.config.vocab_size, free)
            return limits[bucket]

        # Eager rounds time themselves (refine): the first real round at each budget is its measurement.
        chooser = BudgetChooser(None if eager else lambda bucket, budget: self.runner.time_round(bucket, budget),
                                profile, budgets=budgets, probes=budgets, measure_by_running=eager,
                                max_budget=max_budget)
        if profile.seconds and chooser.log:
            chooser.log(f"tree budget costs for batch sizes {sorted(profile.seconds)} from {path}")
        if path is None:
            return chooser
        if eager:
            refine = chooser.refine

            def refine_and_store(bucket: int, budget: int, seconds: float) -> None:
                known = len(profile.seconds.get(bucket, {}))
                refine(bucket, budget, seconds)
                if len(profile.seconds.get(bucket, {})) > known:  # a budget's first measurement
                    profile.save(path)

            chooser.refine = refine_and_store
        else:
            costs = chooser.costs

            def costs_and_store(bucket: int) -> dict[int, float]:
                # A bucket is stored once all its budgets are measured: a process stopped halfway leaves none
                # of it (a stored bucket is never measured again).
                measured = profile.seconds.get(bucket)
                if measured is not None and (NO_DRAFT in measured or not chooser.no_draft):
                    return costs(bucket)  # (every round: no more work than a lookup)
                result = costs(bucket)
                profile.save(path)
                if chooser.log:
                    chooser.log(f"round costs for batch size <= {bucket} kept in {path}")
                return result

            chooser.costs = costs_and_store
        return chooser

    def reserve_all(self, memory_fraction: float = 0.5, free_bytes: int | None = None) -> bool:
        """Grow the caches now to what the longest request needs (max_model_len and a round's spare rows), if
        the new rows fit in `memory_fraction` of the free device memory (`free_bytes`; None: asked of the
        device on CUDA, unbounded elsewhere). Returns whether the caches hold that much. Growing later
        drops every captured graph (they point at the old caches), so a warm-up that should last calls this
        first: a chat request without max_tokens asks for the whole context at once."""
        sp = self.speculator
        if sp.capacity < self.max_capacity:
            if free_bytes is None and sp.device.type == "cuda":
                free_bytes = torch.cuda.mem_get_info(sp.device)[0]
            caches = [sp.cache] + ([sp.draft_cache] if sp.draft_cache is not None else [])
            extra = sum(c.nbytes for c in caches) * (self.max_capacity - sp.capacity) / sp.capacity
            if free_bytes is not None and extra > memory_fraction * free_bytes:
                return False
            sp.reserve(self.max_capacity)
        self.floor_capacity = self.max_capacity  # (asked for: kept while idle too)
        return True

    def capture_graphs(self, max_batch: int, params: SamplingParams, budget: int | None = None) -> int:
        """Capture now the graphs that rounds of up to `max_batch` requests sampled with `params` will
        replay (every bucket up to the one holding max_batch), so no capture lands inside a timed run or
        stalls a server's requests. Also the prefill graphs (which draw first tokens, so `params`' flags
        too) of 1, 2, 4, ... prompts (up to that bucket) of each power-of-two length that fits one step's
        prefill (`prefill_budget` tokens in all). With tree_budget="auto", each bucket's cost profile is
        measured now if it is not known yet (which captures its graphs under these flags), and every budget
        it weighs there is captured. Only on an idle engine (the free slots borrow `params` for the flags,
        then are idle again). Returns the number of graphs captured; 0 where graphs are off (the CPU)."""
        if not self.runner.enabled:
            return 0
        if any(r is not None for r in self.slots):
            raise RuntimeError("capture_graphs needs an idle engine")
        if self.prefixes is not None:  # (captures prefill and run rounds over idle slots, from row 0)
            self.prefixes.forget_all()
            self.seq_lens = [0] * len(self.slots)  # (free slots kept the lengths of the rows they held)
            self.speculator.release_many(list(range(len(self.slots))))
        top = self.runner.bucket(min(max_batch, len(self.slots)))
        before = len(self.runner.graphs) + len(self.runner.prefill_graphs)
        count = 1
        while count <= min(top, len(self.slots)):  # pieces of idle slots 0..count-1 (their rows are free)
            length = PREFILL_MIN_TOKENS
            while length <= self.config.prefill_chunk and count * length <= max(self.config.prefill_budget, length):
                pieces = [PrefillPiece(slot, [0] * length, 0, length) for slot in range(count)]
                if self.runner.prefill_shape(pieces) is None:
                    break
                with self._borrowed(count, params):  # (a prefill graph draws first tokens with these flags)
                    self.runner.prefill(pieces)
                length *= 2
            count *= 2
        for bucket in [b for b in self.runner.buckets if b <= top]:
            with self._borrowed(bucket, params):
                if self.budget is not None:
                    # Measured once per bucket (which captures its graphs under these flags); then each budget
                    # weighed there (no draft among them) under these.
                    for weighed in self.budget.costs(bucket):
                        self.runner.graph(bucket, weighed)
                else:
                    self.runner.graph(bucket, budget)
        return len(self.runner.graphs) + len(self.runner.prefill_graphs) - before

    @contextmanager
    def _borrowed(self, count: int, params: SamplingParams):
        """Idle slots 0..count-1 sampled with `params` (their rows and the flags) while a capture runs, then
        free again."""
        slots = list(range(count))
        self.speculator.set_sampling_many(slots, [params] * count, [0] * count)
        try:
            yield
        finally:
            self.speculator.release_many(slots)

    def add(self, request: Request) -> None:
        self._detok(request)
        self.waiting.append(request)

    def abort(self, request_id: int) -> bool:
        """End a waiting or running request now (finish reason "abort"); False if it is not here."""
        for request in self.waiting:
            if request.id == request_id:
                self.waiting.remove(request)
                request.finish_reason = "abort"
                return True
        for request in self.slots:
            if request is not None and request.id == request_id:
                request.finish_reason = "abort"
                self._retire_if_done(request)
                self._release()
                self._shrink_if_idle()
                return True
        return False

    def has_work(self) -> bool:
        # (A round in flight is work only while a request it ran for is unfinished, and such a request
        # still holds its slot; one that ran only for ended requests is left to the next step to drop.)
        return bool(self.waiting) or any(r is not None for r in self.slots)

    def step(self) -> list[StepUpdate]:
        stats = self.stats
        stats.steps += 1
        clock = time.perf_counter()
        updates = self._admit()
        stats.prefill_seconds += time.perf_counter() - clock
        clock = time.perf_counter()
        try:
            read = self._rounds(updates)
        finally:
            self._release()
            self._shrink_if_idle()
        if read:
            stats.rounds += read
            stats.round_seconds += time.perf_counter() - clock
        stats.generated_tokens += sum(len(u.new_token_ids) for u in updates)
        return updates

    def _running(self) -> list[int]:
        return [i for i, r in enumerate(self.slots) if r is not None and r.running]

    def _rounds(self, updates: list[StepUpdate]) -> int:
        """Launch this step's round and read rounds back: without overlap the one just launched; with it
        the one launched by the step before (after launching this one, so the device never waits for
        the host). Returns how many rounds were read."""
        last, self.in_flight = self.in_flight, None
        read = 0
        try:
            running = self._running()
            if last is not None and running and not self._may_all_end(last):
                self.in_flight = self._launch(running)  # queued on the device behind `last`
        finally:  # (even if that launch failed: `last` has advanced its slots, its tokens must not be lost)
            if last is not None:
                self._read(last, updates)
                read += 1
        if self.in_flight is None:
            running = self._running()  # (without the requests `last` finished)
            if running:
                launched = self._launch(running)
                if self.overlap:
                    self.in_flight = launched
                else:
                    self._read(launched, updates)
                    read += 1
        elif all(request.finished for _, request in self.in_flight.requests):
            self.in_flight = None  # it ran only for requests that have ended: nothing in it is wanted
        return read

    def _may_all_end(self, launched: Launched) -> bool:
        """Whether every request of `launched` may reach max_tokens in it: the tokens it has left are at
        most 1.5x its mean tokens per round so far (1 before its first round). Then the step reads it
        before launching the next round, which would otherwise likely be computed only to be thrown
        away: at batch 1 that is a whole round for every request, against the host's bookkeeping of one
        round, which is what reading first costs."""
        for _, request in launched.requests:
            rounds = len(request.metrics.acceptance_lengths)  # (the first token came from prefill, not a round)
            likely = 1.5 * (len(request.output_ids) - 1) / rounds if rounds else 1.0
            if not request.finished and request.max_new_tokens - len(request.output_ids) > likely:
                return False
        return True

    def _launch(self, running: list[int]) -> Launched:
        """Run (or queue, on a GPU) a round over slots [0, running[-1]] without waiting for it."""
        num_slots = running[-1] + 1
        if self.prefixes is not None:
            self._bound_free_prefixes(running)
        budget = self.budget.choose(self.runner.bucket(num_slots)) if self.budget else None
        start = time.perf_counter()
        # Rows any of these slots may reach this round (committed + what it writes; with overlap the host's
        # seq_lens lag by a round): eager rounds attend over no more (Speculator.round).
        lag = self.round_rows if self.overlap else 0
        kv_rows = max(self.seq_lens[:num_slots]) + lag + rows_per_round(self.speculator.spec, self.speculator.drafter,
                                                                        budget) + 1
        if not self.runner.enabled:
            # Eager rounds grow the caches as requests get long, not to what max_tokens allows at admission: a
            # chat request without max_tokens would take every slot's caches to the whole context (3 GB for
            # SmolLM2 at 8 slots in float32) for an answer of a few hundred tokens.
            self._grow_to(kv_rows)
        result = self.runner.round(num_slots, budget, kv_rows)
        rows, ready = result.readback, None
        if rows.is_cuda and self.overlap:
            # The next replay rewrites the graph's outputs: copy this round's out behind it on the stream.
            shape = tuple(rows.shape)
            if shape not in self._pinned:
                self._pinned[shape] = [(torch.empty(shape, dtype=rows.dtype, pin_memory=True), torch.cuda.Event())
                                       for _ in range(2)]
            host, ready = self._pinned[shape][self._turn]
            self._turn ^= 1
            host.copy_(rows, non_blocking=True)
            ready.record()
            rows = host
        return Launched([(i, self.slots[i]) for i in running], budget, result, rows, ready, start)

    def _read(self, launched: Launched, updates: list[StepUpdate]) -> None:
        """Read a round back (the round's one host synchronisation: accepted counts, emitted tokens and,
        with the automatic budget, the predicted acceptance per budget) and hand its requests their
        tokens. Requests that ended meanwhile (a stop in the round before, an abort) are skipped."""
        if launched.ready is not None:
            launched.ready.synchronize()
        rows = launched.rows.tolist()
        now = time.perf_counter()
        # From its launch, or with overlap from the last read or prefill if later: rounds' times do not overlap.
        elapsed = now - max(launched.start, self._accounted)
        self._accounted = now
        budget, result = launched.budget, launched.result
        emitted = result.walk.emitted.shape[1]
        # The read-back's columns (round.readback): accepted, the emitted tokens, m(B) per auto budget, log-probs.
        width = 1 + emitted
        logprobs_at = width + (result.predicted.shape[1] if result.predicted is not None else 0)
        live = [(i, request) for i, request in launched.requests if not request.finished]
        if self.budget is not None and live:
            if not self.runner.enabled:  # eager rounds: the round just timed refines its cost
                self.budget.refine(self.runner.bucket(len(rows)), budget, elapsed)
            self.budget.observe(budget, [rows[i][0] for i, _ in live],
                                [[x / PREDICTED_SCALE for x in rows[i][width:logprobs_at]] for i, _ in live])
        stage_seconds = result.stage_seconds  # (reads the stage clock: once, not per request)
        for i, request in live:
            accepted = rows[i][0]
            self.seq_lens[i] += accepted
            m = request.metrics
            packed = rows[i][logprobs_at:] if request.logprobs is not None else None
            kept = self._append(request, rows[i][1:1 + accepted],
                                packed and [packed[j * COLUMNS:(j + 1) * COLUMNS] for j in range(accepted)])
            # What the request emitted: a stop or max_tokens may cut the round's last tokens (counting them
            # raised tokens per round by ~2.5% at 128 tokens), so rounds x this mean = its tokens - 1.
            m.acceptance_lengths.append(len(kept))
            if self.budget is not None:
                m.round_budgets.append(budget)
            m.decode_seconds += elapsed
            for stage, seconds in stage_seconds.items():
                m.stage_seconds[stage] = m.stage_seconds.get(stage, 0.0) + seconds
            if self.record_trees:
                request.last_tree = render_tree(result.tree, result.walk, i, self._token_text, drafted=result.drafted)
            updates.append(StepUpdate(request, kept))
            self._retire_if_done(request)

    # --- admission -------------------------------------------------------------------------------
    def _admit(self) -> list[StepUpdate]:
        """Prefill up to `prefill_budget` prompt tokens: the rest of started prompts first, then newcomers.

        A prompt is cut into chunks at fixed offsets (multiples of prefill_chunk from its start), one
        chunk per step, so its numbers do not depend on what else is waiting. A slot mid-prefill is
        inactive: rounds leave its committed rows alone (they write only past them, where the next
        chunk overwrites). The step's pieces run in a few batched forwards (`_forwards`).
        """
        pieces = self._plan_prefill()
        updates = []
        try:
            self._prefill(pieces, updates)
        finally:
            self._release()
        if pieces:  # (the time so far went to prefill, also where a round in flight ran meanwhile)
            self._accounted = time.perf_counter()
        return updates

    def _prefill(self, pieces: list[tuple[Request, int, int]], updates: list[StepUpdate]) -> None:
        for group in _forwards(pieces):
            clock = time.perf_counter()
            self.stats.prefill_forwards += 1
            self.stats.prefill_tokens += sum(e - s for _, s, e in group)
            done = [i for i, (r, _, e) in enumerate(group) if e == len(r.prompt_ids)]
            ready = [group[i][0] for i in done]
            if ready:  # their sampling rows, which the forward's first-token draw reads
                self.speculator.set_sampling_many([r.slot for r in ready], [r.params for r in ready],
                                                  [r.seed for r in ready], [r.prompt_ids for r in ready],
                                                  [r.stop_ids for r in ready], [r.bad_words_ids for r in ready],
                                                  [r.grammar for r in ready])
            # The forward, each slot's commit and every finished prompt's first token: one graph replay on
            # a GPU (Speculator.prefill_and_start); the tokens' read-back is the step's wait for it.
            scored = any(r.prompt_logprobs is not None for r, _, _ in group)
            drawn = self.runner.prefill([PrefillPiece(r.slot, r.prompt_ids, s, e) for r, s, e in group], scored)
            # each piece's [draw, its packed log-probs if asked, its positions' prompt log-probs if any asked]
            first = drawn.tolist() if ready or scored else []
            width = 1 + COLUMNS * self.speculator.flags.logprobs
            elapsed = time.perf_counter() - clock  # each request waited for the whole forward
            for i, (request, start, end) in enumerate(group):
                request.prefilled = self.seq_lens[request.slot] = end
                if self.prefixes is not None:
                    self.prefixes.grow(request.slot, end)
                request.metrics.prefill_seconds += elapsed
                if request.prompt_logprobs is not None:
                    self._prompt_logprobs(request, start, end, first[i][width:])
            for i in done:
                (token, *packed), request = first[i][:width], group[i][0]
                request.metrics.num_prompt_tokens = len(request.prompt_ids)
                updates.append(StepUpdate(request, self._append(request, [token], packed and [packed])))
                self._retire_if_done(request)

    def _prompt_logprobs(self, request: Request, start: int, end: int, columns: list[int]) -> None:
        """The entries of prompt tokens start+1 .. end (those the piece's positions predict; the last one only
        where the prompt goes on) from the piece's packed columns."""
        decode = self.pieces.text if request.params.detokenize and self.tokenizer is not None else None
        prompt = request.prompt_ids
        for t, position in enumerate(range(start, min(end, len(prompt) - 1))):
            request.prompt_logprobs.append(unpack(columns[t * COLUMNS:(t + 1) * COLUMNS], prompt[position + 1],
                                                  request.params.prompt_logprobs, decode))

    def _plan_prefill(self) -> list[tuple[Request, int, int]]:
        """This step's pieces (request, start, end): at most one chunk per request, prefill_budget tokens
        in all (the first piece always goes, so a budget below the chunk still makes progress)."""
        self.started = [r for r in self.started if r.slot is not None and not r.running]
        started = iter(list(self.started))
        # Newcomers wait until admit_batch slots are free (or every waiting request fits, or no slot is busy).
        admit = len(self.free) >= min(self.config.admit_batch, len(self.waiting)) or len(self.free) == len(self.slots)
        pieces, spent = [], 0
        planned: set[int] = set()  # the prefix chunks this step prefills (prefix reuse: each once)
        while True:
            request = next(started, None) or (self._take_slot() if admit else None)
            if request is None:
                break
            if request.waits_for_copy:
                self._catch_up(request)
            start = request.prefilled
            end = min(len(request.prompt_ids), start + self.config.prefill_chunk)
            key = self.prefixes.next_key(request.slot, end) if self.prefixes is not None else None
            # (a prompt sharing this chunk with one before it in this step: n > 1, a batch. Not one asking for
            # prompt log-probs: they come from its own prefill's logits.)
            if key in planned and request.prompt_logprobs is None:
                request.waits_for_copy = True
                continue  # it takes the chunk from that prompt's slot next step, rather than computing it too
            if spent and spent + end - start > self.config.prefill_budget:
                break  # it waits for the next step (a newcomer keeps the slot it was given)
            spent += end - start
            pieces.append((request, start, end))
            if key is not None:
                planned.add(key)
        return pieces

    def _bound_free_prefixes(self, running: list[int]) -> None:
        """A round runs over every slot below its highest running one, and attends over the rows a free one
        holds as over a request's: a free slot there keeps its prompt's rows only while they are no more than
        the longest running request's (no more attention than one request more; on the CPU, no wider eager
        attention for all), and is emptied otherwise."""
        bucket, longest = self.runner.bucket(running[-1] + 1), max(self.seq_lens[i] for i in running)
        costly = [i for i in self.prefixes.holding
                  if i < bucket and self.slots[i] is None and self.seq_lens[i] > longest]
        if costly:
            self.prefixes.forget(costly)
            for i in costly:
                self.seq_lens[i] = 0
            self.speculator.release_many(costly)

    def _catch_up(self, request: Request) -> None:
        """Take the prompt's chunks that another slot prefilled while this request waited (`_plan_prefill`)."""
        request.waits_for_copy = False
        holder, rows = self.prefixes.find(request.prompt_ids, prefer=request.slot) if self.prefixes else (None, 0)
        if rows > request.prefilled:
            self.speculator.copy_prefix(holder, request.slot, rows)
            taken = rows - request.prefilled
            request.prefilled = self.seq_lens[request.slot] = rows
            request.metrics.num_cached_tokens += taken
            self.stats.reused_prompt_tokens += taken
            self.prefixes.grow(request.slot, rows)

    def _take_slot(self) -> Request | None:
        """Give the first waiting request a free slot, with caches long enough for its prompt and a round; with
        CUDA graphs, for all it may need (a growth there recaptures every graph: seconds)."""
        if not self.waiting or not self.free:
            return None
        request = self.waiting.popleft()
        slot = heapq.heappop(self.free)
        generated = request.max_new_tokens if self.runner.enabled else 0  # (eager: `_launch` grows them on)
        self._grow_to(len(request.prompt_ids) + generated + self.spare_rows + 1)
        request.slot, self.slots[slot] = slot, request
        self.started.append(request)
        if self.prefixes is not None:
            self._reuse_prefix(request)
        return request

    def _reuse_prefix(self, request: Request) -> None:
        """Start the request past the whole prefill chunks of its prompt that some slot's caches hold (copied
        into its own slot where another holds them); its slot holds its prompt's chunks from now on. Not for
        a request asking for prompt log-probs: they come from the prefill's own logits."""
        holder, rows = (None, 0) if request.prompt_logprobs is not None else \
            self.prefixes.find(request.prompt_ids, prefer=request.slot)
        if rows:
            self.speculator.copy_prefix(holder, request.slot, rows)  # (and the slot's committed length)
            request.prefilled = self.seq_lens[request.slot] = rows
            request.metrics.num_cached_tokens = rows
            self.stats.reused_prompt_tokens += rows
        self.prefixes.hold(request.slot, request.prompt_ids, rows)

    @property
    def prefixes(self) -> PrefixReuse | None:
        """The prefixes the slots hold (None: prefix reuse off), kept in whole chunks of the configured size."""
        if not self.config.prefix_reuse:
            self._prefixes = None  # (nothing is recorded while off: turned on again, it starts from nothing)
            return None
        if self._prefixes is None or self._prefixes.chunk != self.config.prefill_chunk:
            self._prefixes = PrefixReuse(len(self.slots), self.config.prefill_chunk)  # (nothing held yet)
        return self._prefixes

    def _grow_to(self, rows: int) -> None:
        """Caches of at least `rows` rows per slot; doubling keeps regrowth (a copy of the caches) rare."""
        if rows > self.speculator.capacity:
            self.speculator.reserve(min(max(rows, 2 * self.speculator.capacity), self.max_capacity))

    def _shrink_if_idle(self) -> None:
        """With no request left, eager caches go back to their first size: a long request's rows (GBs on the CPU
        for one that ran to the context) are not held while the engine waits. Graphed rounds keep theirs: the
        graphs are captured over the caches' capacity, and shrinking would mean capturing them again."""
        if not self.runner.enabled and not self.has_work() and self.speculator.capacity > self.floor_capacity:
            # (keeping the rows of the prefixes the slots hold, and a round's past them: the next turn of a
            # chat begins with one, and a free slot's rounds write from its held rows on)
            held = self.prefixes.rows_held() + self.spare_rows + 1 if self.prefixes else 0
            self.speculator.shrink(max(self.floor_capacity, held))

    def _retire_if_done(self, request: Request) -> None:
        """Free a finished request's slot here; its device state is released by `_release`, which the
        step (or abort) calls before anything else can use the slot."""
        if request.finished and request.slot is not None:
            self.slots[request.slot] = None
            # A free slot's length is what it holds of its prompt (0 if nothing): the rounds that run over it
            # while it is free write past that row (a round writes from a slot's length on), not over it.
            self.seq_lens[request.slot] = self.prefixes.rows(request.slot) if self.prefixes is not None else 0
            self.freed.append(request.slot)
            heapq.heappush(self.free, request.slot)
            request.slot = None

    def _release(self) -> None:
        freed, self.freed = self.freed, []
        self.speculator.release_many(freed, [self.seq_lens[slot] for slot in freed])

    # --- stops -----------------------------------------------------------------------------------
    def _append(self, request: Request, tokens: list[int], logprobs: list[list[int]] | None = None) -> list[int]:
        """Append a round's tokens one at a time, as plain decoding would, up to the first that ends the
        request (a stop string, a stop token or max_tokens); returns what was kept. logprobs: each token's
        packed log-prob columns, where the request asks for them.

        Checking token by token is what makes a many-token round end exactly where one-token rounds
        end: with stop=["hello world", "lo"], "say hello world" stops at "lo", after "say hello".
        Each token is detokenised once, incrementally; a stop string is searched only in the text the
        token completed (plus the longest stop string's length before it). Without stop strings the
        text waits for the round's kept tokens and is detokenised in one go.
        """
        detok = self._detok(request)
        by_token = detok is not None and bool(request.params.stop)
        kept, text = [], []
        for j, token in enumerate(tokens):
            kept.append(token)
            request.output_ids.append(token)
            # Before min_tokens nothing stops the request (vLLM's rule; rounds draw no stop token there either).
            stops = len(request.output_ids) >= request.params.min_tokens
            if request.logprobs is not None:
                decode = self.pieces.text if request.params.detokenize and self.tokenizer is not None else None
                request.logprobs.append(unpack(logprobs[j], token, request.params.logprobs, decode))
            if stops and by_token and self._stop_string_hit(request, detok, token):
                pass  # (it ended the request)
            elif stops and token in request.stop_ids:
                request.finish_reason = "stop"  # the stop token ends the text, it is not part of it
                # vLLM's stop_reason: the stop token's id, None for EOS (unless also asked for)
                request.stop_reason = token if token in (request.params.stop_token_ids or ()) else None
            elif by_token:
                detok.push(token)
            else:
                text.append(token)
            if not request.finished and len(request.output_ids) >= request.max_new_tokens:
                request.finish_reason = "length"
            if request.finished:
                break
        if text and detok is not None:
            detok.push_many(text)
        if request.finished and detok is not None and request.stop_string_at is None:
            detok.flush()  # a last incomplete character is text too (as U+FFFD), as one decode gives it
        request.metrics.num_generated_tokens = len(request.output_ids)
        return kept

    def _stop_string_hit(self, request: Request, detok: IncrementalDetokenizer, token: int) -> bool:
        """Would `token` complete a stop string? If so it is added, the text is cut at the earliest
        occurrence found and the request ends. Only occurrences ending in the new text are new (older
        ones would have ended the request already)."""
        stops = request.params.stop
        if not stops:
            return False
        before = len(detok.text)
        added = detok.peek(token)
        # A token that ends in part of a character (a space and an emoji's first byte, say) adds no settled
        # text, but the decode that plain decoding checks has text there: search that (its incomplete end
        # as U+FFFD), or a stop string before the part character would be missed.
        held = not added
        if held:
            added = detok.peek_final(token)
        if not added:
            return False
        text = detok.text + added
        start = max(0, before - max(len(s) for s in stops) + 1)
        hits = [(i, s) for s in stops if (i := text.find(s, start)) >= 0]
        if not hits:
            return False
        detok.push(token)
        if held:
            detok.flush()  # the text up to the cut is final now
        at, request.stop_reason = min(hits, key=lambda hit: hit[0])  # the earliest (the first listed of a tie)
        request.stop_string_at = at + len(request.stop_reason) * request.params.include_stop_str_in_output
        detok.cut(request.stop_string_at)
        request.finish_reason = "stop"
        return True

    def _detok(self, request: Request) -> IncrementalDetokenizer | None:
        if request.detok is None and self.tokenizer is not None and request.params.detokenize:
            request.detok = IncrementalDetokenizer(self.tokenizer, request.params.skip_special_tokens)
        return request.detok

    # --- text ------------------------------------------------------------------------------------
    def _token_text(self, token: int) -> str:
        if self.tokenizer is None:
            return str(token)
        return repr(self.tokenizer.decode([token], skip_special_tokens=False))  # show special tokens too

    def text_of(self, request: Request) -> str:
        return request.detok.text if request.detok is not None else ""

    def text_delta(self, request: Request, sent: int) -> str:
        """The request's text from character `sent` on, up to where it can no longer change.

        Until the request finishes, the last (longest stop string - 1) characters are held back: they
        may still turn out to begin a stop string. (Incomplete characters never reach the text.)
        """
        text = self.text_of(request)
        end = len(text)
        if not request.finished and request.params.stop:
            end -= max(len(s) for s in request.params.stop) - 1
        return text[sent:end] if end > sent else ""

    def output_of(self, request: Request) -> RequestOutput:
        return RequestOutput(request.id, request.prompt, request.prompt_ids, list(request.output_ids),
                             self.text_of(request), request.finish_reason or "length", request.metrics,
                             request.last_tree, None if request.logprobs is None else list(request.logprobs),
                             None if request.prompt_logprobs is None else list(request.prompt_logprobs),
                             request.stop_reason)


def default_budget_profile(engine: Engine) -> Path:
    """Where `tree_budget="auto"` keeps its measured round costs unless told otherwise: the treeflash cache's
    budget_profiles/ (`$TREEFLASH_CACHE`, else ~/.cache/treeflash), a file per device, torch version, treeflash
    sources and engine shape (the models' configurations, dtype, prompt-lookup tokens, slots, graph sizes,
    attention and kernels), which decide what a round costs. Another engine of the same kind finds the costs
    there and skips the measurement (tens of seconds on an H200, minutes where kernels compile for the first
    time)."""
    sp, c = engine.speculator, engine.config
    what = {"device": torch.cuda.get_device_name(sp.device), "torch": torch.__version__, "sources": source_digest(),
            "target": repr(sp.target.config), "drafter": repr(sp.drafter.config) if sp.drafter else None,
            "draft_vocab": None if sp.draft_tokens is None else sp.draft_tokens.numel(),
            "dtype": str(sp.target.embed_tokens.weight.dtype), "spec": sp.spec.method,
            "ngram_tokens": sp.spec.ngram_tokens, "slots": c.max_num_seqs,
            "buckets": engine.runner.buckets, "attention": c.attention, "compile_kernels": c.compile_kernels,
            "tree_kernel": c.tree_kernel, "flex_decode_tokens": c.flex_decode_tokens}
    key = hashlib.sha256(json.dumps(what, sort_keys=True, default=str).encode()).hexdigest()[:16]
    return default_cache_dir() / "budget_profiles" / f"{key}.json"


def _forwards(pieces: list[tuple[Request, int, int]]) -> list[list[tuple[Request, int, int]]]:
    """Group a step's pieces into forwards padded to their longest piece: longest first, a piece joins
    the current forward if it is at least half as long as that forward's first, so padding is at most
    half of each forward's rows. Each piece's numbers do not depend on its group (padding is inert)."""
    groups: list[list[tuple[Request, int, int]]] = []
    for piece in sorted(pieces, key=lambda p: p[2] - p[1], reverse=True):
        if groups and 2 * (piece[2] - piece[1]) >= groups[-1][0][2] - groups[-1][0][1]:
            groups[-1].append(piece)
        else:
            groups.append([piece])
    return groups
