"""Side-by-side baselines on the same weights and prompts: our code calling theirs, one prompt at a time.

- `hf`: transformers `generate` (greedy, a static KV cache of one fixed length reused for every prompt,
  so on CUDA transformers' own auto-compilation of the decode step compiles once, during the warm-up;
  --hf-no-compile turns it off); compared with `none`.
- `dflash-ref`: the reference `dflash==0.1.0` package's generate loop (`dflash.model.dflash_generate`);
  compared with `dflash`.
- `ddtree-ref`: the DDTree authors' code (github.com/liranringel/ddtree, `ddtree.py: ddtree_generate`),
  read at run time from a directory given with --ddtree-ref, never part of this project; compared with
  `ddtree` at the same budget.

The references run batch size 1 and greedy, as they were written. Their per-round timers call
`torch.cuda.synchronize()` unconditionally; on other devices they are given a plain clock.
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
import sys
import time
import types
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch

BASELINES = {"hf": "none", "dflash-ref": "dflash", "ddtree-ref": "ddtree"}  # name -> our method it faces


class BaselineError(ValueError):
    """A baseline that cannot run as asked (missing package or reference code, no drafter...)."""


def parse_baselines(text: str | None) -> list[str]:
    names = [n.strip().lower() for n in (text or "").split(",") if n.strip()]
    bad = [n for n in names if n not in BASELINES]
    if bad:
        raise BaselineError(f"unknown baseline(s) {bad}: choose from {', '.join(BASELINES)}")
    return list(dict.fromkeys(names))


@dataclass
class RefRun:
    """One prompt through a baseline."""

    token_ids: list[int]  # generated tokens only
    seconds: float  # wall time of the whole call (prefill + decode)
    acceptance_lengths: list[int] | None = None  # tokens per round, where the reference reports them
    prefill_seconds: float | None = None
    decode_seconds: float | None = None


@dataclass(frozen=True)
class RefSetup:
    device: torch.device
    dtype: torch.dtype
    max_tokens: int
    stop_token_ids: list[int] | None  # None: generate max_tokens whatever comes
    drafter_dir: Path | None = None
    ddtree_ref: Path | None = None
    tree_budget: int = 64
    hf_compile: bool = True  # let transformers compile its decode step where it does so itself (CUDA)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _plain_clock() -> float:
    return time.perf_counter()


def load_hf_target(model_dir: Path, device: torch.device, dtype: torch.dtype):
    """The target as transformers loads it (SDPA attention), for every baseline."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=dtype, attn_implementation="sdpa")
    return model.to(device).eval()


class HFGenerate:
    name, compares_to = "hf", "none"

    def __init__(self, target, setup: RefSetup, max_prompt_len: int):
        from transformers import StaticCache

        self.target, self.setup = target, setup
        import transformers

        self.source = f"transformers=={transformers.__version__} generate, static cache, compile {'auto' if setup.hf_compile else 'off'}"
        # One cache length for every prompt: a compiled decode step is then reused, never recompiled.
        self.cache = StaticCache(config=target.config, max_cache_len=max_prompt_len + setup.max_tokens + 1)

    @torch.inference_mode()
    def __call__(self, prompt: list[int]) -> RefRun:
        s = self.setup
        ids = torch.tensor([prompt], device=s.device)
        self.cache.reset()
        stop = {"eos_token_id": s.stop_token_ids} if s.stop_token_ids else \
            {"eos_token_id": None, "min_new_tokens": s.max_tokens}
        _sync(s.device)
        start = time.perf_counter()
        out = self.target.generate(ids, attention_mask=torch.ones_like(ids), past_key_values=self.cache,
                                   max_new_tokens=s.max_tokens, do_sample=False, pad_token_id=0,
                                   disable_compile=not s.hf_compile, **stop)
        _sync(s.device)
        return RefRun(out[0, len(prompt):].tolist(), time.perf_counter() - start)


class DFlashReference:
    name, compares_to = "dflash-ref", "dflash"

    def __init__(self, target, setup: RefSetup):
        try:
            from dflash import model as ref
        except ImportError:
            raise BaselineError("dflash-ref needs the reference package: pip install --no-deps dflash==0.1.0") from None
        if setup.drafter_dir is None:
            raise BaselineError("dflash-ref needs a drafter (--draft-model or --random-drafter)")
        from importlib.metadata import version

        self.source = f"dflash=={version('dflash')} dflash_generate"
        self.ref, self.target, self.setup = ref, target, setup
        self.drafter = ref.DFlashDraftModel.from_pretrained(str(setup.drafter_dir), dtype=setup.dtype).to(setup.device).eval()

    def __call__(self, prompt: list[int]) -> RefRun:
        s = self.setup
        ids = torch.tensor([prompt], device=s.device)
        with _patched(self.ref, "_cuda_time", None if s.device.type == "cuda" else _plain_clock):
            _sync(s.device)
            start = time.perf_counter()
            out = self.ref.dflash_generate(self.drafter, self.target, ids, s.max_tokens, s.stop_token_ids,
                                           temperature=0.0, return_stats=True)
            _sync(s.device)
            seconds = time.perf_counter() - start
        return RefRun(out.output_ids[0, len(prompt):].tolist(), seconds, list(out.acceptance_lengths),
                      out.time_to_first_token, out.time_per_output_token * out.num_output_tokens)


class DDTreeReference:
    name, compares_to = "ddtree-ref", "ddtree"

    def __init__(self, target, setup: RefSetup):
        if setup.drafter_dir is None:
            raise BaselineError("ddtree-ref needs a drafter (--draft-model or --random-drafter)")
        self.ddtree, model_pkg = load_ddtree_reference(setup.ddtree_ref)
        stamp = setup.ddtree_ref / "SOURCE"  # where the copy came from, if whoever staged it wrote that down
        self.source = stamp.read_text().strip() if stamp.is_file() else f"DDTree reference code from {setup.ddtree_ref}"
        if setup.device.type != "cuda":
            self.ddtree.cuda_time = _plain_clock  # our private copy of their module: nothing else sees this
        self.target, self.setup = target, setup
        self.drafter = model_pkg.DFlashDraftModel.from_pretrained(str(setup.drafter_dir), dtype=setup.dtype)
        self.drafter = self.drafter.to(setup.device).eval()

    def __call__(self, prompt: list[int]) -> RefRun:
        s = self.setup
        ids = torch.tensor([prompt], device=s.device)
        _sync(s.device)
        start = time.perf_counter()
        out = self.ddtree.ddtree_generate(
            model=self.drafter, target=self.target, input_ids=ids, mask_token_id=self.drafter.mask_token_id,
            max_new_tokens=s.max_tokens, block_size=self.drafter.block_size, stop_token_ids=s.stop_token_ids,
            temperature=0.0, tree_budget=s.tree_budget)
        _sync(s.device)
        seconds = time.perf_counter() - start
        return RefRun(out.output_ids[0, len(prompt):].tolist(), seconds, list(out.acceptance_lengths),
                      out.time_to_first_token, out.time_per_output_token * out.num_output_tokens)


def build_baseline(name: str, target, setup: RefSetup, max_prompt_len: int):
    if name == "hf":
        return HFGenerate(target, setup, max_prompt_len)
    if name == "dflash-ref":
        return DFlashReference(target, setup)
    if name == "ddtree-ref":
        return DDTreeReference(target, setup)
    raise BaselineError(f"unknown baseline {name!r}")


# --- loading the DDTree reference code -----------------------------------------------------------------
_REF_MODULES = ("ddtree", "dflash", "model")  # their top-level names; `dflash` clashes with the PyPI package


def _theirs(name: str) -> bool:
    return any(name == m or name.startswith(m + ".") for m in _REF_MODULES)


def load_ddtree_reference(path: Path | None):
    """Import the DDTree reference (ddtree.py, dflash.py, model/) from `path` as private modules.

    Their files use top-level names (`dflash`, `model`) that clash with installed packages, so they
    are imported with those names cleared and the previous modules put back afterwards; the returned
    module objects keep working. Missing imports they need only for logging and dataset loading
    (loguru, datasets: neither is used by the generate loop) get stand-ins if not installed.
    Returns (the ddtree module, their model package).
    """
    if path is None:
        raise BaselineError("ddtree-ref needs --ddtree-ref DIR: a directory holding the DDTree reference code "
                            "(ddtree.py, dflash.py, model/ from github.com/liranringel/ddtree)")
    path = Path(path).expanduser().resolve()
    missing = [f for f in ("ddtree.py", "dflash.py", "model/__init__.py") if not (path / f).is_file()]
    if missing:
        raise BaselineError(f"{path}: not the DDTree reference code (missing {', '.join(missing)})")
    saved = {n: m for n, m in sys.modules.items() if _theirs(n)}
    for n in saved:
        del sys.modules[n]
    sys.path.insert(0, str(path))
    try:
        with _stand_ins():
            ddtree = importlib.import_module("ddtree")
            model_pkg = sys.modules["model"]
    finally:
        sys.path.remove(str(path))
        for n in [n for n in sys.modules if _theirs(n)]:
            del sys.modules[n]
        sys.modules.update(saved)
    return ddtree, model_pkg


@contextmanager
def _stand_ins():
    added = []
    if importlib.util.find_spec("loguru") is None:
        loguru = types.ModuleType("loguru")
        loguru.logger = logging.getLogger("ddtree-ref")
        added.append(("loguru", loguru))
    if importlib.util.find_spec("datasets") is None:
        datasets = types.ModuleType("datasets")

        def unavailable(*args, **kwargs):
            raise BaselineError("the DDTree reference's dataset loading is not available in treeflash bench")

        for attr in ("load_dataset", "Features", "Sequence", "Value"):
            setattr(datasets, attr, unavailable)
        added.append(("datasets", datasets))
    for name, module in added:
        sys.modules[name] = module
    try:
        yield
    finally:
        for name, _ in added:
            sys.modules.pop(name, None)


@contextmanager
def _patched(module, attr: str, value):
    """Temporarily replace module.attr (value None: leave it alone)."""
    if value is None:
        yield
        return
    old = getattr(module, attr)
    setattr(module, attr, value)
    try:
        yield
    finally:
        setattr(module, attr, old)
