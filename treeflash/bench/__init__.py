"""`treeflash bench`: real-model runs, synthetic shapes and side-by-side baselines (see cli.py).

    from treeflash.bench import BenchConfig, run_bench, SyntheticConfig, run_synthetic

Names load lazily, so `treeflash --help` does not import torch.
"""

from __future__ import annotations

_EXPORTS = {
    "BenchConfig": "treeflash.bench.run", "run_bench": "treeflash.bench.run",
    "SyntheticConfig": "treeflash.bench.synthetic", "run_synthetic": "treeflash.bench.synthetic",
    "load_prompts": "treeflash.bench.datasets", "SHAPES": "treeflash.bench.shapes",
    "format_bench": "treeflash.bench.report", "format_synthetic": "treeflash.bench.synthetic",
    "plot_bench": "treeflash.bench.plots", "plot_synthetic": "treeflash.bench.plots",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'treeflash.bench' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(_EXPORTS[name]), name)
