"""What every rank of a tensor-parallel group does alike: where the target comes from, the plans rank 0
sends its workers, and joining the group (NCCL between GPUs, gloo on CPU)."""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from pathlib import Path

import torch

from treeflash.engine import EngineConfig
from treeflash.models.parallel import Communicator
from treeflash.round import SpecConfig

# Multicast over NVLink (NVLS) can take shared GPUs out of service on the machines this project runs on;
# it is kept off in every rank, workers included (they inherit rank 0's environment and set it again).
NCCL_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
COLLECTIVE_TIMEOUT = datetime.timedelta(minutes=10)  # a rank that hangs (without dying) fails after this
STARTUP_TIMEOUT_S = 600.0


@dataclass(frozen=True)
class CheckpointTarget:
    """A target read from a checkpoint directory: each rank reads only its slice of every weight.

    A target source is any picklable object with these three methods (`bench/synthetic.py` has one that
    builds random weights at a real shape instead); every rank, rank 0 included, builds from the same one.
    """

    model_dir: Path

    def load(self, device: torch.device, dtype: torch.dtype, shard):
        """(the rank's decoder, the whole model's ModelConfig)"""
        from treeflash.checkpoint import load_target

        return load_target(self.model_dir, device, dtype, shard)

    def tokenizer(self):
        from treeflash.checkpoint import load_tokenizer

        return load_tokenizer(self.model_dir)

    def drafter(self, draft_model: str | None, device: torch.device, dtype: torch.dtype):
        """The replicated drafter (None without one)."""
        from treeflash.checkpoint import load_drafter

        return None if draft_model is None else load_drafter(draft_model, device, dtype)


@dataclass(frozen=True)
class WorkerPlan:
    """What a worker needs to load its shard (sent when it is started)."""

    source: CheckpointTarget  # or another target source (see CheckpointTarget)
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


def process_group(plan: WorkerPlan, rank: int, store):
    """This rank's backend of the group: NCCL between GPUs, gloo on CPU. Standalone (not torch's default
    group), so an LLM never claims the process-wide torch.distributed state of the program it runs in."""
    import torch.distributed as dist

    prefixed = dist.PrefixStore("treeflash-tp", store)
    if plan.device_of(rank).type == "cuda":
        options = dist.ProcessGroupNCCL.Options()
        options._timeout = COLLECTIVE_TIMEOUT
        return dist.ProcessGroupNCCL(prefixed, rank, plan.size, options)
    return dist.ProcessGroupGloo(prefixed, rank, plan.size, COLLECTIVE_TIMEOUT)


def connect(comm: Communicator, plan: WorkerPlan, rank: int, store) -> None:
    device = plan.device_of(rank)
    comm.connect(process_group(plan, rank, store))
    # One all-reduce now: NCCL creates its communicator lazily on the first collective, which must not
    # happen inside a CUDA graph capture; it also proves every rank is connected.
    probe = torch.ones(1, device=device)
    comm.all_reduce(probe)
    if int(probe.item()) != plan.size:
        raise RuntimeError(f"tensor-parallel rank {rank}: connection check summed to {probe.item()}, not {plan.size}")
