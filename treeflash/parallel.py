"""Tensor parallelism across processes: rank 0 is the caller's `LLM`, ranks 1..N-1 are workers it starts.

SPMD. Every rank holds its shard of the target (`models/parallel.py`), a whole copy of the drafter and an
identical `Engine`. Rank 0's engine (`MirroredEngine`) sends every call that changes engine state (add,
abort, step) to the workers through a pipe, in order, and each worker applies it to its own engine. All
ranks therefore run the same round on the same inputs; the all-reduces inside the target give every rank
the same logits, so derive, walk and commit decide the same everywhere and the engines stay in lockstep
with no communication beyond the all-reduces. Greedy and seeded sampling are deterministic by design
(counter-based uniforms), so that holds for sampling too.

Processes: torch.multiprocessing with the spawn method (one process per GPU on CUDA, NCCL between them;
gloo on CPU). Rank 0 hosts the rendezvous store. A worker that dies, or raises, is reported by rank 0
with its error, and the other workers are stopped; a worker whose parent dies exits by itself. `close()`
(called by `LLM.close`, `__del__` and at interpreter exit) stops them all.

NOTE: spawn re-imports the caller's main module in every worker, so a script that builds an LLM with
tensor_parallel_size > 1 must do it under `if __name__ == "__main__":` (as with any spawn-based library).
"""

from __future__ import annotations

import atexit
import datetime
import os
import signal
import sys
import threading
import time
import traceback
from contextlib import contextmanager
from dataclasses import dataclass
from multiprocessing.connection import wait
from pathlib import Path

import torch

from treeflash.engine import Engine, EngineConfig, Request, StepUpdate
from treeflash.models.parallel import Communicator, Shard
from treeflash.round import SpecConfig

# Multicast over NVLink (NVLS) can take shared GPUs out of service on the machines this project runs on;
# it is kept off in every rank, workers included (they inherit rank 0's environment and set it again).
NCCL_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
COLLECTIVE_TIMEOUT = datetime.timedelta(minutes=10)  # a rank that hangs (without dying) fails after this
STARTUP_TIMEOUT_S = 600.0


class TensorParallelError(RuntimeError):
    """A tensor-parallel worker died or failed; the group is shut down and the LLM cannot continue."""


@dataclass(frozen=True)
class WorkerPlan:
    """What a worker needs to load its shard (sent when it is started)."""

    model_dir: Path
    device: str  # "cpu" or "cuda:<rank 0's index>"; rank r uses cuda:<index + r>
    dtype: torch.dtype
    size: int
    store_port: int
    threads: int  # torch CPU threads, as rank 0 has

    def device_of(self, rank: int) -> torch.device:
        base = torch.device(self.device)
        return base if base.type == "cpu" else torch.device("cuda", (base.index or 0) + rank)


@dataclass(frozen=True)
class EnginePlan:
    """What a worker needs to build its engine (sent once rank 0 has validated everything)."""

    draft_model: str | None
    spec: SpecConfig
    config: EngineConfig


def _process_group(plan: WorkerPlan, rank: int, store):
    """This rank's backend of the group: NCCL between GPUs, gloo on CPU. Standalone (not torch's default
    group), so an LLM never claims the process-wide torch.distributed state of the program it runs in."""
    import torch.distributed as dist

    prefixed = dist.PrefixStore("treeflash-tp", store)
    if plan.device_of(rank).type == "cuda":
        options = dist.ProcessGroupNCCL.Options()
        options._timeout = COLLECTIVE_TIMEOUT
        return dist.ProcessGroupNCCL(prefixed, rank, plan.size, options)
    return dist.ProcessGroupGloo(prefixed, rank, plan.size, COLLECTIVE_TIMEOUT)


def _connect(comm: Communicator, plan: WorkerPlan, rank: int, store) -> None:
    device = plan.device_of(rank)
    comm.connect(_process_group(plan, rank, store))
    # One all-reduce now: NCCL creates its communicator lazily on the first collective, which must not
    # happen inside a CUDA graph capture; it also proves every rank is connected.
    probe = torch.ones(1, device=device)
    comm.all_reduce(probe)
    if int(probe.item()) != plan.size:
        raise RuntimeError(f"tensor-parallel rank {rank}: connection check summed to {probe.item()}, not {plan.size}")


class TensorParallel:
    """Rank 0's side of a tensor-parallel group: starts the workers, loads rank 0's shard, watches them.

    `TensorParallel(size, model_dir, device, dtype)` starts N-1 workers that load their shards while rank 0
    loads its own (`.model`, `.config`); `.engine(...)` then builds every rank's engine and returns rank 0's.
    """

    def __init__(self, size: int, model_dir: Path, device: torch.device, dtype: torch.dtype):
        import torch.distributed as dist
        import torch.multiprocessing as mp

        from treeflash.checkpoint import load_target

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
        self._closed = self._closing = False
        self._lock = threading.Lock()
        self._monitor: threading.Thread | None = None
        self._store = dist.TCPStore("127.0.0.1", 0, size, is_master=True, wait_for_workers=False,
                                    timeout=datetime.timedelta(seconds=STARTUP_TIMEOUT_S))
        self.plan = WorkerPlan(Path(model_dir), str(device), dtype, size, self._store.port, torch.get_num_threads())
        ctx = mp.get_context("spawn")
        self._procs, self._cmds, self._status = [], [], []
        atexit.register(self.close)
        try:
            for rank in range(1, size):
                cmd_recv, cmd_send = ctx.Pipe(duplex=False)
                status_recv, status_send = ctx.Pipe(duplex=False)
                proc = ctx.Process(target=_worker_main, args=(rank, self.plan, cmd_recv, status_send),
                                   name=f"treeflash-tp{rank}")
                proc.start()
                cmd_recv.close()
                status_send.close()
                self._procs.append(proc)
                self._cmds.append(cmd_send)
                self._status.append(status_recv)
            self.comm = Communicator()
            # Rank 0 loads its shard while the workers load theirs.
            self.model, self.config = load_target(self.plan.model_dir, device, dtype, Shard(0, size, self.comm))
            self._await("loaded")
        except BaseException:
            self.close()
            raise

    @property
    def pids(self) -> list[int]:
        """The workers' process ids (ranks 1..N-1)."""
        return [p.pid for p in self._procs]

    def engine(self, drafter, draft_model: str | Path | None, spec: SpecConfig, tokenizer,
               config: EngineConfig) -> "MirroredEngine":
        """Build every rank's engine (workers load the drafter from `draft_model`); returns rank 0's."""
        try:
            self._send(("build", EnginePlan(None if draft_model is None else str(draft_model), spec, config)))
            _connect(self.comm, self.plan, 0, self._store)
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
        return f"tensor-parallel worker {i + 1} (pid {proc.pid}) {how}"

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
            for proc in self._procs:
                proc.join(timeout=10.0 if polite else 0.0)
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
    a collective for good. A second Ctrl-C interrupts at once (and the group is then shut down)."""
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


# --- the worker process ---------------------------------------------------------------------------
def _worker_main(rank: int, plan: WorkerPlan, cmds, status) -> None:
    """Rank `rank`: load the shard, build the engine, then apply rank 0's commands until told to stop."""
    try:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole process group: rank 0 decides
        _exit_with_parent()
        if plan.device_of(rank).type == "cuda":
            os.environ.update(NCCL_ENV)
            torch.cuda.set_device(plan.device_of(rank))
        torch.set_num_threads(plan.threads)
        engine = _build_worker(rank, plan, cmds, status)
        if engine is None:
            return
        while True:
            op, *args = cmds.recv()
            if op == "step":
                engine.step()
            elif op == "add":
                engine.add(args[0])
            elif op == "abort":
                engine.abort(args[0])
            elif op == "close":
                return
            else:
                raise RuntimeError(f"unknown command {op!r}")
    except EOFError:
        return  # rank 0 closed its end of the pipe: it is gone, so is the group
    except BaseException:
        try:
            status.send(("error", traceback.format_exc()))
        except OSError:
            pass
        sys.exit(1)


def _build_worker(rank: int, plan: WorkerPlan, cmds, status) -> Engine | None:
    """The worker's half of `TensorParallel.__init__` and `.engine` (same steps, same order)."""
    import torch.distributed as dist

    from treeflash.checkpoint import load_drafter, load_target, load_tokenizer

    comm = Communicator()
    device = plan.device_of(rank)
    target, _ = load_target(plan.model_dir, device, plan.dtype, Shard(rank, plan.size, comm))
    status.send("loaded")
    op, *args = cmds.recv()
    if op == "close":
        return None
    engine_plan: EnginePlan = args[0]
    store = dist.TCPStore("127.0.0.1", plan.store_port, plan.size, is_master=False,
                          timeout=datetime.timedelta(seconds=STARTUP_TIMEOUT_S))
    _connect(comm, plan, rank, store)
    # NOTE: the same drafter, tokenizer (stop strings) and engine settings as rank 0's LLM, so every
    # decision the engine takes is the same on every rank.
    drafter = None
    if engine_plan.draft_model is not None and engine_plan.spec.method != "none":
        drafter = load_drafter(engine_plan.draft_model, device, plan.dtype)
    engine = Engine(target, drafter, engine_plan.spec, load_tokenizer(plan.model_dir), engine_plan.config)
    status.send("ready")
    return engine


def _exit_with_parent() -> None:
    """Leave no orphan: when rank 0's process ends, however abruptly, this worker ends too."""
    import multiprocessing

    parent = multiprocessing.parent_process()
    if parent is None:
        return

    def watch() -> None:
        parent.join()
        os._exit(1)

    threading.Thread(target=watch, name="treeflash-tp-parent-watch", daemon=True).start()
