"""The engine: requests in slots, one round per step, emitted tokens cut exactly at stops.

The engine is long-lived: `LLM` builds one and every call (and, later, the server) feeds it requests.
`Engine.step()` admits waiting requests into free slots (prefill + first token), runs one round over
the running slots (a CUDA graph replay on a GPU, treeflash/runner.py), reads the emitted tokens back
(the round's only host synchronisation) and finishes requests whose tokens hit a stop token, a stop
string, max_tokens or the context limit. With tree_budget="auto" each round's budget is chosen from
the cost profile and the recent acceptance (treeflash/budget.py), using only what that sync read.
`Engine.abort()` ends a request at once, waiting or running, and frees its slot.
"""

from __future__ import annotations

import os
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

import torch

from treeflash.budget import AUTO_BUDGETS, BudgetChooser, CostProfile
from treeflash.outputs import RequestMetrics, RequestOutput
from treeflash.round import STAGES, SpecConfig, Speculator, rows_per_round
from treeflash.runner import GraphRunner
from treeflash.sampling import SamplingParams
from treeflash.tree_view import render_tree


_FIXED = 1 << 16  # predicted acceptance travels in the round's integer copy as fixed point


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
    slot: int | None = None
    metrics: RequestMetrics = field(default_factory=RequestMetrics)
    last_tree: str | None = None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class StepUpdate:
    request: Request
    new_token_ids: list[int]


@dataclass(frozen=True)
class EngineConfig:
    max_num_seqs: int = 8  # slots: requests that run side by side
    max_model_len: int = 2048  # prompt + generated tokens of one request
    time_stages: bool = True  # time each round's stages (synchronises on a GPU)
    record_trees: bool = False  # keep each request's last draft tree, drawn
    min_capacity: int = 256  # caches start this long and double as requests need
    cuda_graphs: bool = True  # replay rounds as CUDA graphs (CUDA only; the CPU always runs eagerly)
    attention: str | None = None  # "sdpa" or "flex" (treeflash/attention.py); None: the device's default
    budget_profile: str | None = None  # tree_budget="auto": a stored CostProfile (JSON) to load or write


class Engine:
    """Owns the speculator (caches sized by the engine, grown on demand) and the request slots."""

    def __init__(self, target, drafter, spec: SpecConfig, tokenizer, config: EngineConfig):
        self.config, self.tokenizer = config, tokenizer
        # Rows a request can ever need: its whole context, plus what one round writes past it.
        self.round_rows = rows_per_round(spec, drafter)
        self.max_capacity = config.max_model_len + self.round_rows + 1
        self.speculator = Speculator(target, drafter, spec, config.max_num_seqs,
                                     capacity=min(config.min_capacity, self.max_capacity),
                                     time_stages=config.time_stages, attention=config.attention)
        self.runner = GraphRunner(self.speculator, enabled=config.cuda_graphs, time_stages=config.time_stages)
        self.budget = self._budget_chooser(config) if spec.auto else None
        self.record_trees = config.record_trees
        self.slots: list[Request | None] = [None] * config.max_num_seqs
        self.seq_lens = [0] * len(self.slots)  # host copy, known after each round's one sync
        self.waiting: deque[Request] = deque()

    def _budget_chooser(self, config: EngineConfig) -> BudgetChooser:
        sp = self.speculator
        device = torch.cuda.get_device_name(sp.device) if sp.device.type == "cuda" else "cpu"
        path = Path(config.budget_profile) if config.budget_profile else None
        profile = CostProfile.load(path) if path and path.is_file() else CostProfile(device)
        if profile.device != device:
            raise ValueError(f"{path}: a cost profile measured on {profile.device!r}, this is {device!r}")
        # Eager CPU rounds are slow to measure at large budgets: measure three, interpolate the rest.
        probes = AUTO_BUDGETS if self.runner.enabled else (16, 64, 256)
        chooser = BudgetChooser(self.runner.time_round, profile, probes=probes)
        if path is not None:
            measure = chooser.measure

            def measure_and_store(bucket: int, budget: int) -> float:
                seconds = measure(bucket, budget)
                profile.seconds.setdefault(bucket, {})[budget] = seconds
                profile.save(path)
                return seconds

            chooser.measure = measure_and_store
        return chooser

    def add(self, request: Request) -> None:
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
                return True
        return False

    def has_work(self) -> bool:
        return bool(self.waiting) or any(r is not None for r in self.slots)

    def step(self) -> list[StepUpdate]:
        updates = self._admit()
        running = [i for i, r in enumerate(self.slots) if r is not None]
        if not running:
            return updates
        num_slots = running[-1] + 1
        budget = self.budget.choose(self.runner.bucket(num_slots)) if self.budget else None
        start = time.perf_counter()
        result = self.runner.round(num_slots, budget)
        # The round's one host synchronisation: accepted counts, emitted tokens and (auto budget) the
        # predicted acceptance per budget, as fixed point, in one copy.
        parts = [result.walk.accepted[:, None], result.walk.emitted]
        if result.predicted is not None:
            parts.append((result.predicted * _FIXED).round().long())
        rows = torch.cat(parts, 1).tolist()
        width = 1 + result.walk.emitted.shape[1]
        accepted, emitted = [r[0] for r in rows], [r[1:width] for r in rows]
        elapsed = time.perf_counter() - start
        if self.budget is not None:
            self.budget.observe(budget, [accepted[i] for i in running],
                                [[x / _FIXED for x in rows[i][width:]] for i in running])
        for i in running:
            request = self.slots[i]
            self.seq_lens[i] += accepted[i]
            m = request.metrics
            m.acceptance_lengths.append(accepted[i])
            m.decode_seconds += elapsed
            for stage in STAGES:
                if stage in result.stage_seconds:
                    m.stage_seconds[stage] = m.stage_seconds.get(stage, 0.0) + result.stage_seconds[stage]
            if self.record_trees:
                request.last_tree = render_tree(result.tree, result.walk, i, self._token_text)
            updates.append(StepUpdate(request, self._append(request, emitted[i][:accepted[i]])))
            self._retire_if_done(request)
        return updates

    # --- admission -------------------------------------------------------------------------------
    def _admit(self) -> list[StepUpdate]:
        updates = []
        while self.waiting and None in self.slots:
            request = self.waiting.popleft()
            slot = self.slots.index(None)
            start = time.perf_counter()
            need = len(request.prompt_ids) + request.max_new_tokens + self.round_rows + 1
            if need > self.speculator.capacity:  # doubling keeps regrowth (a copy of the caches) rare
                self.speculator.reserve(min(max(need, 2 * self.speculator.capacity), self.max_capacity))
            first = self.speculator.admit(slot, request.prompt_ids, request.params, request.seed)
            token = int(first)
            request.metrics.prefill_seconds = time.perf_counter() - start
            request.metrics.num_prompt_tokens = len(request.prompt_ids)
            request.slot, self.slots[slot], self.seq_lens[slot] = slot, request, len(request.prompt_ids)
            updates.append(StepUpdate(request, self._append(request, [token])))
            self._retire_if_done(request)
        return updates

    def _retire_if_done(self, request: Request) -> None:
        if request.finished and request.slot is not None:
            self.speculator.release(request.slot)
            self.slots[request.slot] = None
            self.seq_lens[request.slot] = 0
            request.slot = None

    # --- stops -----------------------------------------------------------------------------------
    def _append(self, request: Request, tokens: list[int]) -> list[int]:
        """Append a round's tokens one at a time, as plain decoding would, up to the first that ends the
        request (a stop token, max_tokens or a stop string); returns what was kept.

        Checking token by token is what makes a many-token round end exactly where one-token rounds
        end: with stop=["hello world", "lo"], "say hello world" stops at "lo", after "say hello".
        """
        strings = bool(request.params.stop) and self.tokenizer is not None
        text = self._decode(request.output_ids) if strings else ""
        kept = []
        for token in tokens:
            kept.append(token)
            request.output_ids.append(token)
            if token in request.stop_ids:
                request.finish_reason = "stop"
            elif len(request.output_ids) >= request.max_new_tokens:
                request.finish_reason = "length"
            if strings:
                text = self._check_stop_strings(request, text)
            if request.finished:
                break
        request.metrics.num_generated_tokens = len(request.output_ids)
        return kept

    def _check_stop_strings(self, request: Request, before: str) -> str:
        """Did the last output token complete a stop string? `before` is the text without that token;
        returns the text with it. On a hit the request ends, and its text is cut at the earliest
        occurrence found.

        Only occurrences that end in the part of the text the token changed are new (older ones would
        have ended the request already), so the search starts at most `longest - 1` characters before
        that part. The token usually appends to the text, but it may also rewrite the end of it: a
        partial UTF-8 character decodes as U+FFFD until its last byte arrives.
        """
        text = self._decode(request.output_ids)
        stable = _common_prefix_len(before, text)
        from_char = max(0, stable - max(len(s) for s in request.params.stop) + 1)
        hits = [i for s in request.params.stop if (i := text.find(s, from_char)) >= 0]
        if hits:
            request.finish_reason, request.stop_string_at = "stop", min(hits)
        return text

    # --- text ------------------------------------------------------------------------------------
    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True) if self.tokenizer is not None else ""

    def _token_text(self, token: int) -> str:
        if self.tokenizer is None:
            return str(token)
        return repr(self.tokenizer.decode([token], skip_special_tokens=False))  # show special tokens too

    def text_of(self, request: Request) -> str:
        ids = request.output_ids
        if request.finish_reason == "stop" and request.stop_string_at is None and ids and ids[-1] in request.stop_ids:
            ids = ids[:-1]  # the stop token ends the text, it is not part of it
        text = self._decode(ids)
        return text[:request.stop_string_at] if request.stop_string_at is not None else text

    def output_of(self, request: Request) -> RequestOutput:
        return RequestOutput(request.id, request.prompt, request.prompt_ids, list(request.output_ids),
                             self.text_of(request), request.finish_reason or "length", request.metrics,
                             request.last_tree)


def _common_prefix_len(a: str, b: str) -> int:
    """An n with a[:n] == b[:n]: the longest, or less (a search that starts earlier is still exact)."""
    if b.startswith(a):  # the usual case: the token appended text
        return len(a)
    trimmed = a.rstrip("\ufffd")  # a partial UTF-8 character was completed (or continued)
    if b.startswith(trimmed):
        return len(trimmed)
    return len(os.path.commonprefix([a, b]))  # e.g. a tokenizer's clean-up rewrote earlier spaces
