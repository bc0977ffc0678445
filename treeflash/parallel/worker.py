"""A tensor-parallel worker process (rank 1..N-1): load the shard, build the engine, then apply rank 0's
commands (add, abort, step) in order until told to close."""

from __future__ import annotations

import datetime
import os
import signal
import sys
import threading
import traceback

import torch

from treeflash.engine import Engine
from treeflash.models.parallel import Communicator, Shard
from treeflash.parallel.rank import NCCL_ENV, STARTUP_TIMEOUT_S, EnginePlan, WorkerPlan, connect


def main(rank: int, plan: WorkerPlan, cmds, status) -> None:
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
    connect(comm, plan, rank, store)
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
