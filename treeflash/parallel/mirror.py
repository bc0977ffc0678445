"""Rank 0's engine in a tensor-parallel group: every state-changing call goes to the workers first."""

from __future__ import annotations

import signal
import threading
from contextlib import contextmanager
from typing import TYPE_CHECKING

from treeflash.engine import Engine, Request, StepUpdate

if TYPE_CHECKING:
    from treeflash.parallel.group import TensorParallel


class MirroredEngine(Engine):
    """Rank 0's engine: each state-changing call is sent to the workers, then applied here.

    NOTE: every Engine method that changes engine state must be mirrored here, or the ranks drift apart.
    """

    def __init__(self, tp: TensorParallel, *args):
        super().__init__(*args)
        self.tp = tp

    def add(self, request: Request) -> None:
        self.tp._send(("add", request))
        super().add(request)

    def abort(self, request_id: int) -> bool:
        if self.tp.failure is None and not self.tp._closed:
            self.tp._send(("abort", request_id))
        return super().abort(request_id)  # after a failure: free the slot here; the workers are gone

    def capture_graphs(self, max_batch, params, budget=None) -> int:
        # A capture runs the round (and its collectives) on this rank alone: the workers would never join.
        # Graphs are captured lazily at first use instead, in lockstep, as every round is.
        return 0

    def step(self) -> list[StepUpdate]:
        self.tp._send(("step",))
        with _interrupt_after_step():
            try:
                updates = super().step()
            except BaseException as e:
                failure = self.tp.stopped(e)
                if failure is not None:
                    raise failure from e
                raise
        return updates


@contextmanager
def _interrupt_after_step():
    """Hold a Ctrl-C until the step ends: a rank that leaves a step half-done leaves the others waiting in
    a collective for good. A second Ctrl-C interrupts at once (and the group is then shut down), unless
    rank 0 is blocked inside a collective waiting for a worker that is alive but stuck: Python runs no
    handler there, and the collective's timeout (10 minutes) ends it. A worker that dies is noticed at once."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    pending = []

    def hold(signum, frame):
        if pending:
            raise KeyboardInterrupt
        pending.append(signum)

    previous = signal.signal(signal.SIGINT, hold)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
    if pending and callable(previous):
        previous(signal.SIGINT, None)
