"""Rank 0's side of a tensor-parallel group: starts the workers, loads rank 0's shard, watches the workers,
shuts them all down."""

from __future__ import annotations

import atexit
import datetime
import os
import threading
import time
from multiprocessing.connection import wait
from pathlib import Path

import torch

from treeflash.engine import EngineConfig
from treeflash.models.parallel import Communicator, Shard
from treeflash.parallel.mirror import MirroredEngine
from treeflash.parallel.rank import (NCCL_ENV, STARTUP_TIMEOUT_S, CheckpointTarget, EnginePlan, WorkerPlan,
                                    connect)
from treeflash.parallel.worker import main as worker_main
from treeflash.round import SpecConfig


class TensorParallelError(RuntimeError):
    """A tensor-parallel worker died or failed; the group is shut down and the LLM cannot continue."""


class TensorParallel:
    """Rank 0's side of a tensor-parallel group: starts the workers, loads rank 0's shard, watches them.

    `TensorParallel(size, source, device, dtype)` starts N-1 workers that load their shards while rank 0
    loads its own (`.model`, `.config`); `.engine(...)` then builds every rank's engine and returns rank 0's.
    source: where the target comes from (`CheckpointTarget(model_dir)`, or a directory path for short).
    """

    def __init__(self, size: int, source, device: torch.device, dtype: torch.dtype):
        import torch.distributed as dist
        import torch.multiprocessing as mp

        if not dist.is_available():
            raise ValueError("tensor_parallel_size > 1 needs a torch build with torch.distributed")
        if device.type == "cuda":
            base = device.index or 0
            if torch.cuda.device_count() < base + size:
                raise ValueError(f"tensor_parallel_size={size} needs {size} GPUs from cuda:{base}; "
                                 f"{torch.cuda.device_count()} are visible")
            os.environ.update(NCCL_ENV)
        elif device.type != "cpu":
            raise ValueError(f"tensor parallelism runs on cpu (gloo) or cuda (NCCL), not {device.type}")
        self.size, self.failure = size, None
        self._closed = self._closing = self._loaded = False
        self._lock = threading.Lock()
        self._monitor: threading.Thread | None = None
        self._store = dist.TCPStore("127.0.0.1", 0, size, is_master=True, wait_for_workers=False,
                                    timeout=datetime.timedelta(seconds=STARTUP_TIMEOUT_S))
        if isinstance(source, (str, Path)):
            source = CheckpointTarget(Path(source))
        self.plan = WorkerPlan(source, str(device), dtype, size, self._store.port, torch.get_num_threads())
        ctx = mp.get_context("spawn")
        self._procs, self._cmds, self._status = [], [], []
        atexit.register(self.close)
        try:
            for rank in range(1, size):
                cmd_recv, cmd_send = ctx.Pipe(duplex=False)
                status_recv, status_send = ctx.Pipe(duplex=False)
                proc = ctx.Process(target=worker_main, args=(rank, self.plan, cmd_recv, status_send),
                                   name=f"treeflash-tp{rank}")
                proc.start()
                cmd_recv.close()
                status_send.close()
                self._procs.append(proc)
                self._cmds.append(cmd_send)
                self._status.append(status_recv)
            self.comm = Communicator()
            # Rank 0 loads its shard while the workers load theirs.
            self.model, self.config = source.load(device, dtype, Shard(0, size, self.comm))
            self._await("loaded")
            self._loaded = True
        except BaseException:
            self._shutdown(polite=False)  # the workers may still be loading: they read no command yet
            raise

    @property
    def pids(self) -> list[int]:
        """The workers' process ids (ranks 1..N-1)."""
        return [p.pid for p in self._procs]

    def engine(self, drafter, draft_model: str | Path | None, spec: SpecConfig, tokenizer,
               config: EngineConfig) -> "MirroredEngine":
        """Build every rank's engine (workers get the drafter from the source and `draft_model`); returns
        rank 0's. A later call builds a new engine on every rank in place of the last one (a benchmark's
        next configuration); drop the previous rank-0 engine first, as the workers drop theirs."""
        plan = EnginePlan(None if draft_model is None else str(draft_model), spec, config)
        if self._monitor is not None:
            # The group is connected and watched: building involves no collective, so no handshake;
            # a worker that fails to build reports through the monitor, and the next step raises it.
            self._send(("build", plan))
            return MirroredEngine(self, self.model, drafter, spec, tokenizer, config)
        try:
            self._send(("build", plan))
            self._connect_watched()
            engine = MirroredEngine(self, self.model, drafter, spec, tokenizer, config)
            self._await("ready")
        except BaseException:
            self.close()
            raise
        self._monitor = threading.Thread(target=self._watch, name="treeflash-tp-monitor", daemon=True)
        self._monitor.start()
        return engine

    # --- commands to the workers ------------------------------------------------------------------
    def _send(self, message: tuple) -> None:
        if self.failure is not None or self._closed:
            self._shutdown(polite=False)  # returns once the monitor, if it is shutting down, is done
            raise TensorParallelError(self.failure or "the tensor-parallel group was closed (LLM.close())")
        try:
            for conn in self._cmds:
                conn.send(message)
        except BaseException as e:  # OSError: a worker's end is gone (it died); else a partial send
            failure = self.stopped(e)
            if failure is not None:
                raise failure from e
            raise

    def stopped(self, error: BaseException) -> TensorParallelError | None:
        """Rank 0 stopped mid-step (an error or an interrupt): the ranks are now out of step for good.

        Shuts the group down. Returns the workers' failure as an error to raise when a worker caused it
        (rank 0's own error is then only its symptom), else None (the caller re-raises its own error).
        """
        if self.failure is None and self._monitor is not None:
            # A peer that died is what usually breaks a collective: give the monitor a moment to say so.
            if wait([p.sentinel for p in self._procs], timeout=1.0):
                self._monitor.join(timeout=5.0)
        if self.failure is None:
            self._fail(f"rank 0 stopped in the middle of a tensor-parallel step ({type(error).__name__}: "
                       f"{error}); the ranks are out of step, so the workers were stopped: build a new LLM")
            return None
        self._shutdown(polite=False)
        return TensorParallelError(self.failure)

    # --- watching the workers ---------------------------------------------------------------------
    def _connect_watched(self) -> None:
        """Join the group in a thread of its own while this one watches the workers: a worker that fails
        before it joins left rank 0 in the rendezvous until the store's timeout (10 minutes), deaf to
        Ctrl-C, and its error unread."""
        done, errors = threading.Event(), []

        def join() -> None:
            try:
                connect(self.comm, self.plan, 0, self._store)
            except BaseException as e:  # noqa: BLE001 - raised in the caller's thread below
                errors.append(e)
            finally:
                done.set()

        threading.Thread(target=join, name="treeflash-tp-connect", daemon=True).start()
        while not done.is_set():
            # Only exits are watched here (a live worker's next message, "ready", is _await's to read).
            dead = wait([p.sentinel for p in self._procs], timeout=0.1)
            if dead and not done.is_set():
                i = next(i for i, p in enumerate(self._procs) if p.sentinel in dead)
                self._fail(self._describe(i, self._read_status(i)))
                raise TensorParallelError(self.failure)
        if errors:
            raise errors[0]

    def _await(self, what: str) -> None:
        """Wait until every worker reports `what` ("loaded" or "ready"); a worker that fails raises."""
        pending, deadline = set(range(len(self._procs))), time.monotonic() + STARTUP_TIMEOUT_S
        while pending:
            ready = wait([self._status[i] for i in pending] + [self._procs[i].sentinel for i in pending],
                         timeout=max(0.0, deadline - time.monotonic()))
            if not ready:
                raise TensorParallelError(f"tensor-parallel workers did not report {what!r} within "
                                          f"{STARTUP_TIMEOUT_S:.0f} s")
            for i in list(pending):
                message = self._read_status(i)
                if message == what:
                    pending.discard(i)
                elif message is not None or not self._procs[i].is_alive():
                    self._fail(self._describe(i, message))
                    raise TensorParallelError(self.failure)

    def _watch(self) -> None:
        """Monitor thread: the first worker death or error shuts the group down and is recorded."""
        handles = [p.sentinel for p in self._procs] + list(self._status)
        try:
            while not self._closing:
                wait(handles)
                if self._closing:
                    return
                for i, proc in enumerate(self._procs):
                    message = self._read_status(i)
                    if message is not None or not proc.is_alive():
                        self._fail(self._describe(i, message))
                        return
        except (OSError, ValueError):  # the pipes were closed under us: only by a shutdown
            if not self._closing:
                raise

    def _read_status(self, i: int):
        conn = self._status[i]
        try:
            return conn.recv() if conn.poll() else None
        except (EOFError, OSError):
            return None

    def _describe(self, i: int, message) -> str:
        proc = self._procs[i]
        if isinstance(message, tuple) and message[0] == "error":
            return f"tensor-parallel worker {i + 1} (pid {proc.pid}) failed:\n{message[1]}"
        proc.join(timeout=1.0)
        code = proc.exitcode
        how = f"was killed by signal {-code}" if code is not None and code < 0 else f"exited with code {code}"
        # A worker that ends before loading, saying nothing, most often ran the script's top level again
        # (spawn imports the main module) and failed there.
        hint = "" if self._loaded or message is not None else (
            "; before it loaded its shard: spawn re-runs the script's top level in each worker, so build the "
            "LLM under `if __name__ == \"__main__\":` (its traceback, if any, is above)")
        return f"tensor-parallel worker {i + 1} (pid {proc.pid}) {how}{hint}"

    def _fail(self, reason: str) -> None:
        if self.failure is None:
            self.failure = reason
        self._shutdown(polite=False)

    # --- shutting down ----------------------------------------------------------------------------
    def close(self) -> None:
        """Stop the workers (politely: each finishes and exits) and release the group. Idempotent."""
        self._shutdown(polite=self.failure is None)

    def _shutdown(self, polite: bool) -> None:
        with self._lock:  # the monitor thread and the caller may both get here; the second waits
            if self._closed:
                return
            self._closed = self._closing = True
            atexit.unregister(self.close)
            group = getattr(getattr(self, "comm", None), "group", None)
            if group is not None and not polite and hasattr(group, "abort"):
                # NCCL: a collective rank 0 is blocked in would otherwise wait for the dead peer until timeout.
                try:
                    group.abort()
                except Exception:
                    pass
            if polite:
                for conn in self._cmds:
                    try:
                        conn.send(("close",))
                    except OSError:
                        pass
            deadline = time.monotonic() + (10.0 if polite else 0.0)  # one for all the workers, not one each
            for proc in self._procs:
                proc.join(timeout=max(0.0, deadline - time.monotonic()))
                if proc.is_alive():
                    proc.terminate()
                    proc.join(timeout=5.0)
                if proc.is_alive():
                    proc.kill()
                    proc.join()
            monitor = self._monitor
            if monitor is not None and monitor is not threading.current_thread():
                monitor.join(timeout=2.0)  # it wakes on the exits, sees the shutdown and returns
            for conn in (*self._cmds, *self._status):
                conn.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass
