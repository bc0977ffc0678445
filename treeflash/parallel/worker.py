"""A tensor-parallel worker process (rank 1..N-1): load the shard, then apply rank 0's commands (build an
engine, add, abort, step) in order until told to close."""

from __future__ import annotations

import datetime
import gc
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
        comm = Communicator()
        device = plan.device_of(rank)
        target, _ = plan.source.load(device, plan.dtype, Shard(rank, plan.size, comm))
        status.send("loaded")
        engine, builder = None, None
        while True:
            op, *args = cmds.recv()
            if op == "step":
                engine.step()
            elif op == "add":
                engine.add(args[0])
            elif op == "abort":
                engine.abort(args[0])
            elif op == "build":
                engine = None  # free the last engine's caches and graphs before the next one takes memory
                if builder is None:  # the first build joins the group
                    builder = _Builder(rank, plan, comm, target)
                    engine = builder.engine(args[0])
                    status.send("ready")
                else:
                    _free(device)
                    engine = builder.engine(args[0])
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


class _Builder:
    """The worker's half of `TensorParallel.engine` (same steps, same order): joins the group once, then
    builds an engine per plan from this rank's shard."""

    def __init__(self, rank: int, plan: WorkerPlan, comm: Communicator, target):
        import torch.distributed as dist

        self.rank, self.plan, self.target = rank, plan, target
        self.device = plan.device_of(rank)
        store = dist.TCPStore("127.0.0.1", plan.store_port, plan.size, is_master=False,
                              timeout=datetime.timedelta(seconds=STARTUP_TIMEOUT_S))
        connect(comm, plan, rank, store)
        self.tokenizer = plan.source.tokenizer()
        self.drafters: dict[str | None, object] = {}

    def engine(self, engine_plan: EnginePlan) -> Engine:
        # NOTE: the same drafter, tokenizer (stop strings) and engine settings as rank 0's, so every
        # decision the engine takes is the same on every rank.
        drafter = None
        if engine_plan.spec.method != "none":
            key = engine_plan.draft_model
            if key not in self.drafters:
                self.drafters[key] = self.plan.source.drafter(key, self.device, self.plan.dtype)
            drafter = self.drafters[key]
        return Engine(self.target, drafter, engine_plan.spec, self.tokenizer, engine_plan.config)


def _free(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


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
