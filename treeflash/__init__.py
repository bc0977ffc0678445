"""treeflash: lossless speculative decoding with DFlash drafters and DDTree draft trees."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

__all__ = ["CompletionOutput", "LLM", "RequestMetrics", "RequestOutput", "SamplingParams"]
__version__ = "0.1.0"

# Public names load their module on first use, so `treeflash --help` and `--version` do not pay for
# importing torch (seconds, more on a busy machine); `from treeflash import LLM` works as usual.
_LAZY = {"CompletionOutput": "treeflash.outputs", "LLM": "treeflash.llm", "RequestMetrics": "treeflash.outputs", "RequestOutput": "treeflash.outputs",
         "SamplingParams": "treeflash.sampling"}

if TYPE_CHECKING:
    from treeflash.llm import LLM
    from treeflash.outputs import CompletionOutput, RequestMetrics, RequestOutput
    from treeflash.sampling import SamplingParams


def __getattr__(name: str):
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value  # later look-ups skip this function
        return value
    raise AttributeError(f"module 'treeflash' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(list(globals()) + __all__)
