"""The engine loop: ONE thread owns the engine and steps it while there is work.

That thread is the one that built the LLM where the caller can arrange it (`run`: `treeflash serve` and
`run-batch` step the engine on the main thread and run HTTP on another), else a thread of its own
(`start`). On the CPU it matters: an OpenMP runtime keeps a pool of worker threads per thread that ran a
parallel region, and with more of them than cores (the builder's pool idle, the engine thread's busy)
GNU OpenMP stops spinning between regions, so every small parallel op pays a sleep and a wake-up: the
default pair's rounds took 1.3-1.5x as long on a second thread with two torch threads on two cores.

HTTP handlers (on the asyncio loop) never touch the engine. They hand it requests and aborts through
a command queue; the engine thread applies commands between steps, so a request joins or leaves the
running batch between two rounds. After each step the thread sends every request's new text (what
can no longer change, see `Engine.text_delta`) to the asyncio queue of the HTTP call that owns it.
A failure inside a step fails the requests in flight (their clients get an error) and the loop goes
on serving; nothing a client sends reaches the engine unvalidated.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

from treeflash.engine import Engine, Request
from treeflash.server.metrics import ServerMetrics

log = logging.getLogger("treeflash.server")


class ShuttingDown(RuntimeError):
    """The server stopped taking requests."""


@dataclass(frozen=True)
class TokenLogprob:
    """One generated token's log-prob entry as OpenAI shows it: its text and bytes, its log-prob and the
    most likely tokens' (text, log-prob, bytes), most likely first."""

    token: str
    logprob: float | None  # None: an echoed prompt's first token
    bytes: list[int]
    top: list[tuple[str, float, list[int]]]


@dataclass(frozen=True)
class PromptLogprobs:
    """A request's prompt log-probs (SamplingParams.prompt_logprobs), sent with its choice's first event: the
    engine's entries (vLLM's format, None for the first token) and the same as OpenAI's per-token entries (an
    echoed prompt's, its first token's log-prob None)."""

    entries: list[dict | None]
    tokens: list[TokenLogprob]


@dataclass(frozen=True)
class Event:
    """New text for one choice of an HTTP call; the last event of a choice has its finish reason."""

    index: int  # the choice, in the order the call's requests were submitted
    text: str
    finish_reason: str | None
    prompt_tokens: int
    completion_tokens: int
    # With log-probs asked for: the entries of the tokens generated since the last event (their text may
    # still be held back, `Engine.text_delta`; over a choice's events they cover every generated token)
    logprobs: list[TokenLogprob] | None = None
    prompt: PromptLogprobs | None = None  # the choice's first event, where prompt log-probs were asked for
    stop_reason: int | str | None = None  # with finish_reason "stop": the stop string or token id (None: EOS)
    cached_tokens: int = 0  # prompt tokens an earlier prompt's prefill left in the caches (prefix reuse)


class RequestGroup:
    """The engine requests of one HTTP call (its prompts x n choices) and the queue of their events."""

    def __init__(self, requests: list[Request]):
        self.requests = requests
        self.queue: asyncio.Queue[Event | BaseException] = asyncio.Queue()
        self.arrival = time.perf_counter()
        self.open = set(range(len(requests)))

    async def events(self) -> AsyncIterator[Event]:
        """Events until every choice has finished; an engine failure is raised here."""
        while self.open:
            item = await self.queue.get()
            if isinstance(item, BaseException):
                raise item
            if item.finish_reason is not None:
                self.open.discard(item.index)
            yield item


@dataclass
class _Tracked:
    """Engine-thread bookkeeping of one request."""

    group: RequestGroup
    index: int
    sent: int = 0  # characters of text already sent
    tokens: int = 0  # output tokens already seen
    logprobs: int = 0  # log-prob entries already sent
    prompt_sent: bool = False  # the prompt's log-probs (where asked for) went with an event
    rounds: int = 0  # acceptance lengths already recorded
    last_time: float = 0.0


class EngineLoop:
    def __init__(self, engine: Engine, metrics: ServerMetrics):
        self.engine, self.metrics = engine, metrics
        self._commands: queue.SimpleQueue = queue.SimpleQueue()
        self._wake = threading.Event()
        self._tracked: dict[int, _Tracked] = {}  # engine thread only
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._running = False  # run() has begun and not returned
        self.closing = False

    # --- the asyncio side ------------------------------------------------------------------------
    def attach(self, loop: asyncio.AbstractEventLoop) -> None:
        """The asyncio loop that consumes the events (where `run` steps the engine on another thread)."""
        self._loop = loop

    def start(self) -> None:
        """Step the engine on a thread of its own; call from the asyncio loop that will consume the events."""
        self.attach(asyncio.get_running_loop())
        self._running = True  # (before the thread runs: a request submitted at once is taken)
        # A daemon: a forced exit (a second Ctrl-C) must not wait for a round to end.
        self._thread = threading.Thread(target=self.run, name="treeflash-engine", daemon=True)
        self._thread.start()

    def run(self) -> None:
        """Step the engine on the calling thread until `stop` (best the thread that built the LLM: see above)."""
        self._running = True
        try:
            self._run()
        finally:
            self._running = False

    @property
    def alive(self) -> bool:
        return self._running

    def submit(self, requests: list[Request]) -> RequestGroup:
        if self.closing or not self.alive:
            raise ShuttingDown("the server is shutting down and takes no new requests")
        group = RequestGroup(requests)
        self._send("add", group)
        return group

    def abort(self, group: RequestGroup) -> None:
        """End the group's unfinished requests now (the client went away); their slots are freed."""
        if group.open:
            self._send("abort", group)

    def stop(self, timeout: float = 30.0) -> None:
        """Take no more requests, abort what is left and end `run` (waiting up to `timeout` s for a thread of
        its own; `run` on another thread returns after its current step)."""
        self.closing = True
        self._send("stop", None)  # (sent even before `run` began on another thread: it ends at once then)
        if self._thread is not None and self._thread.is_alive():
            self._thread.join(timeout)

    def _send(self, kind: str, group: RequestGroup | None) -> None:
        self._commands.put((kind, group))
        self._wake.set()

    # --- the engine thread -----------------------------------------------------------------------
    def _run(self) -> None:
        while True:
            self._wake.clear()  # before reading commands: one sent after this wakes the wait below
            if not self._apply_commands():
                return
            if self.engine.has_work():
                self._step()
            else:
                self._wake.wait()

    def _apply_commands(self) -> bool:
        """Apply queued adds and aborts; False once told to stop."""
        while True:
            try:
                kind, group = self._commands.get_nowait()
            except queue.Empty:
                return True
            if kind == "add":
                for index, request in enumerate(group.requests):
                    self._tracked[request.id] = _Tracked(group, index)
                    self.engine.add(request)
            elif kind == "abort":
                for request in group.requests:
                    if request.id in self._tracked:
                        self.engine.abort(request.id)
                        self._forget(request, time.perf_counter())
            else:
                self._fail_all(ShuttingDown("the server shut down before this request finished"))
                return False

    def _step(self) -> None:
        try:
            updates = self.engine.step()
        except Exception as error:  # a bug or an out-of-memory fails these requests, not the server
            log.exception("engine step failed; failing the requests in flight")
            self._fail_all(error)
            return
        now = time.perf_counter()
        requests = list({id(u.request): u.request for u in updates}.values())  # each once, in order
        in_round = sum(1 for r in requests if r.metrics.rounds > self._tracked[r.id].rounds)
        if in_round:
            self.metrics.batch_size.observe(in_round)
        events = []
        for request in requests:
            tracked = self._tracked[request.id]
            self._record_tokens(request, tracked, now)
            text = self.engine.text_delta(request, tracked.sent)
            tracked.sent += len(text)
            logprobs = self._new_logprobs(request, tracked)
            prompt = None
            if request.prompt_logprobs is not None and not tracked.prompt_sent:
                prompt, tracked.prompt_sent = self._prompt_logprobs(request), True
            if text or logprobs or prompt or request.finished:
                events.append((tracked.group, Event(tracked.index, text, request.finish_reason,
                                                    len(request.prompt_ids), len(request.output_ids), logprobs,
                                                    prompt, request.stop_reason, request.metrics.num_cached_tokens)))
            if request.finished:
                self._forget(request, now)
        self._set_gauges()
        self._deliver(events)

    def _new_logprobs(self, request: Request, tracked: _Tracked) -> list[TokenLogprob] | None:
        """The entries of the tokens whose log-probs were not sent yet (None where none were asked for). Made
        here, on the engine thread, whose tokenizer they decode with."""
        if request.logprobs is None:
            return None
        top = request.params.logprobs
        out = [self._token_logprob(token, entry, top) for token, entry in
               zip(request.output_ids[tracked.logprobs:], request.logprobs[tracked.logprobs:])]
        tracked.logprobs += len(out)
        return out

    def _token_logprob(self, token: int, entry: dict, top: int) -> TokenLogprob:
        pieces = self.engine.pieces
        best = sorted(entry.items(), key=lambda item: (item[1].rank, -item[1].logprob))[:top]
        return TokenLogprob(pieces.text(token), entry[token].logprob, pieces.bytes(token),
                            [(pieces.text(t), lp.logprob, pieces.bytes(t)) for t, lp in best])

    def _prompt_logprobs(self, request: Request) -> PromptLogprobs:
        pieces, first = self.engine.pieces, request.prompt_ids[0]
        tokens = [TokenLogprob(pieces.text(first), None, pieces.bytes(first), [])] + [
            self._token_logprob(token, entry, request.params.prompt_logprobs)
            for token, entry in zip(request.prompt_ids[1:], request.prompt_logprobs[1:])]
        return PromptLogprobs(list(request.prompt_logprobs), tokens)

    def _record_tokens(self, request: Request, tracked: _Tracked, now: float) -> None:
        m, new = self.metrics, len(request.output_ids) - tracked.tokens
        if tracked.tokens == 0 and new:
            m.time_to_first_token.observe(now - tracked.group.arrival)
            m.prompt_tokens.inc(len(request.prompt_ids))
            m.cached_prompt_tokens.inc(request.metrics.num_cached_tokens)
        elif new:
            gap = (now - tracked.last_time) / new
            for _ in range(new):
                m.inter_token_latency.observe(gap)
        m.generation_tokens.inc(new)
        for accepted in request.metrics.acceptance_lengths[tracked.rounds:]:
            m.acceptance_length.observe(accepted)
        tracked.tokens, tracked.rounds, tracked.last_time = len(request.output_ids), request.metrics.rounds, now

    def _forget(self, request: Request, now: float) -> None:
        tracked = self._tracked.pop(request.id)
        self.metrics.finished.labels(request.finish_reason or "abort").inc()
        self.metrics.request_latency.observe(now - tracked.group.arrival)
        self._set_gauges()

    def _set_gauges(self) -> None:
        slots = [r for r in self.engine.slots if r is not None]
        running = sum(1 for r in slots if r.running)
        self.metrics.running.set(running)
        self.metrics.waiting.set(len(self.engine.waiting) + len(slots) - running)

    def _fail_all(self, error: BaseException) -> None:
        """Abort every request in flight and hand `error` to their HTTP calls."""
        groups = {}
        for request_id, tracked in list(self._tracked.items()):
            self.engine.abort(request_id)
            groups[id(tracked.group)] = tracked.group
            self._forget(tracked.group.requests[tracked.index], time.perf_counter())
        self._deliver([(group, error) for group in groups.values()])

    def _deliver(self, events: list) -> None:
        if not events or self._loop is None:
            return

        def put_all() -> None:
            for group, event in events:
                group.queue.put_nowait(event)

        try:
            self._loop.call_soon_threadsafe(put_all)  # one wake-up of the asyncio loop per step
        except RuntimeError:
            pass  # the asyncio loop has closed: nobody is listening any more
