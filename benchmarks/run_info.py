"""What every benchmark result records about how and where it ran."""

from __future__ import annotations

import datetime
import platform
import shlex
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from treeflash import provenance  # noqa: E402


def git_commit() -> str:
    """The checkout's commit (+ "-dirty" with uncommitted changes), or "unknown" outside a git tree."""
    git = provenance.git_commit()
    return "unknown" if git["commit"] is None else git["commit"] + ("-dirty" if git["dirty"] else "")


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"{platform.machine()} CPU ({platform.processor() or 'unknown'}), {torch.get_num_threads()} threads"


def run_info(device: torch.device) -> dict:
    return {
        "command": "python " + " ".join(shlex.quote(a) for a in sys.argv),
        "git_commit": git_commit(),
        "source_digest": provenance.source_digest(),  # scripts/which_commit.py finds its commit
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "device": device_name(device),
        "torch": torch.__version__,
        "python": platform.python_version(),
    }
