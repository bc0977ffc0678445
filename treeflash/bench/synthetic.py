"""`treeflash bench --synthetic SHAPE`: per-round cost at a real shape, against our AR step and the floor.

Random weights at a real target's shape (and its DFlash drafter's) are built directly on the device.
For every batch size, our autoregressive step, the DFlash chain and DDTree at each budget run on
caches holding `context` committed rows; each round is timed, and split by stage in a separate pass.
The floor is the target's weight bytes over the copy bandwidth measured in the same run: a decode
step cannot beat reading every weight once.

Variants (`--variants KERNELS/N[/ATTENTION][/treekernel|/treeops],...`) time the same combinations with
other engine kernels on the same weights, in one run: KERNELS "compiled" (fused projections + compiled
pieces, the CUDA default) or "eager" (compile_kernels=False), N the new tokens up to which FlexAttention's
decoding kernel runs (flex_decode_tokens), ATTENTION an attention backend (treeflash/attention.py; default:
the device's), "treekernel" / "treeops" DDTree's builder as one Triton kernel (treeflash/tree_kernel.py) /
as torch ops at every budget, the walk and the verify mask too (treeflash/walk_kernel.py; neither: the
engine's choice per budget). Each (batch, method) runs every variant in turn, so a run cut short still has
whole comparisons. `ddtree:auto` runs the engine's budget chooser on a cost profile made of the fixed
budgets measured before it (same variant and batch), so it probes only the round without a draft (budget 0,
which the profile lacks). With random weights the drafter is never confident: auto drafts at the cheapest
budget for its first rounds (treeflash/budget.py: NO_DRAFT_AFTER), then mostly rounds without a draft (an
exploring round still drafts now and then, spaced by the cost ratio and backed off while none pays). Its row
is the median over the timed rounds (after the warm-up ones), whichever regime they fell in; auto=B names its
choice after them (0: a round without a draft).
The stage split (a separate pass) is timed for the first variant only.

With `tensor_parallel_size` N > 1 the target is split over N ranks by the same machinery as
`LLM(tensor_parallel_size=N)` (treeflash/parallel/): rank 0 is this process, the workers are started
by `TensorParallel`, each rank builds only its shard with random weights (`SyntheticTarget`), and
every round runs through the mirrored engine, its runner and CUDA graphs, as in serving. Rank 0's
clock is read (the ranks are in lockstep). First, in the same run, the whole target on rank 0's
device times the one-device AR step at each batch size, so the AR ratio comes from one run.
"""

from __future__ import annotations

import gc
import json
import math
import re
import sys
import tempfile
import traceback
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from tqdm import tqdm

from treeflash.bench.methods import NGRAM_TOKENS, parse_methods
from treeflash.bench.shapes import (build_drafter, build_target, decode_read_bytes, drafter_config, drafter_params,
                                    shape, target_config, target_params, weight_bytes)
from treeflash.bench.report import environment
from treeflash.bench.timing import copy_bandwidth, time_engine_rounds
from treeflash.attention import BACKENDS, FLEX_DECODE_TOKENS
from treeflash.config import ModelConfig
from treeflash.engine import Engine
from treeflash.models.dflash import DraftVocab, DrafterConfig
from treeflash.round import MAX_NGRAM_TOKENS, TREE_BUILDERS
from treeflash.sampling import SamplingParams

KERNELS = ("compiled", "eager")
# DDTree's builder forced (round.TREE_BUILDERS): /treekernel the Triton kernel, /treeops torch ops
FORCED_BUILDERS = {f"tree{name}": setting for name, setting in TREE_BUILDERS.items() if setting is not None}


@dataclass(frozen=True)
class Variant:
    """Engine kernels a synthetic row ran with, written KERNELS/N[/ATTENTION][/treekernel|/treeops][/dvM] (e.g.
    compiled/1, eager/32, compiled/16/splitkv, compiled/16/treeops, compiled/16/dv32768). dvM: the drafter
    drafts over a draft vocabulary of M tokens (`DraftVocab`, as `train-drafter --draft-vocab-size M` ships),
    its lm_head over those rows only."""

    label: str
    compile_kernels: bool
    flex_decode_tokens: int
    attention: str | None = None  # None: the device's default backend
    tree_kernel: bool | None = None  # None: the engine's choice per budget (round.use_tree_kernel)
    draft_vocab: int | None = None  # tokens of the drafter's draft vocabulary (None: the whole vocabulary)

    @staticmethod
    def parse(text: str) -> "Variant":
        parts = text.strip().split("/")
        kernels, tokens, *extra = parts if len(parts) >= 2 else (parts[0], "")  # (KERNELS alone: refused below)
        vocabs = [x for x in extra if re.fullmatch(r"dv[1-9][0-9]*", x)]
        extra = [x for x in extra if x not in vocabs]
        attention = next((x for x in extra if x in BACKENDS), None)
        builders = [x for x in extra if x in FORCED_BUILDERS]
        if kernels not in KERNELS or not tokens.isdigit() or len(extra) > 2 or len(vocabs) > 1 or \
                any(x not in BACKENDS and x not in FORCED_BUILDERS for x in extra) or len(builders) > 1 or \
                sum(x in BACKENDS for x in extra) > 1:
            raise ValueError(f"variant {text!r}: expected KERNELS/N[/ATTENTION][/treekernel|/treeops][/dvM] with "
                             f"KERNELS one of {KERNELS}, N the new tokens up to which FlexAttention's decoding "
                             f"kernel runs, ATTENTION one of {BACKENDS}, treekernel / treeops to force DDTree's "
                             f"Triton / torch tree builder, dvM a draft vocabulary of M tokens (e.g. compiled/1, "
                             f"compiled/16/splitkv, compiled/16/treeops, compiled/16/dv32768)")
        label = "/".join([kernels, str(int(tokens)), *extra, *vocabs])
        return Variant(label, kernels == "compiled", int(tokens), attention,
                       FORCED_BUILDERS[builders[0]] if builders else None,
                       int(vocabs[0][2:]) if vocabs else None)

    def engine_options(self) -> dict:
        return {"compile_kernels": self.compile_kernels, "flex_decode_tokens": self.flex_decode_tokens,
                "attention": self.attention, "tree_kernel": self.tree_kernel}


DEFAULT_VARIANT = f"compiled/{FLEX_DECODE_TOKENS}"


def parse_batch_methods(text: str) -> list[tuple[int, str]]:
    """"1=none,ddtree:64 8,32=none,ddtree:4" -> [(1, "none,ddtree:64"), (8, ...), (32, ...)]: methods per batch."""
    out = []
    for group in text.split():
        batches, eq, methods = group.partition("=")
        if not eq or not methods:
            raise ValueError(f"--batch-methods group {group!r}: expected BATCHES=METHODS, e.g. 8,32=none,ddtree:4")
        parse_methods(methods)
        for b in batches.split(","):
            if not b.isdigit() or int(b) < 1:
                raise ValueError(f"--batch-methods group {group!r}: batch sizes must be positive integers")
            out.append((int(b), methods))
    if not out:
        raise ValueError("--batch-methods is empty")
    return out


@dataclass(frozen=True)
class SyntheticConfig:
    shape: str
    device: str | None = None
    dtype: str | None = None
    context: int = 1024  # committed rows per slot when rounds are timed
    batch_sizes: tuple[int, ...] = (1,)
    methods: str = "none,dflash,ddtree:16,ddtree:32,ddtree:64,ddtree:128,ddtree:256,ddtree:512"
    rounds: int = 10  # timed rounds per (batch size, method)
    warmup: int = 2
    stage_rounds: int = 3
    temperature: float = 0.0
    drafter_layers: int | None = None  # default: the shape's
    block_size: int | None = None
    seed: int = 0
    max_logits_gib: float = 24.0  # skip combinations whose full-vocabulary logits would exceed this
    variants: tuple[str, ...] = (DEFAULT_VARIANT,)  # engine kernels to compare (Variant.parse)
    tensor_parallel_size: int = 1  # ranks the target is split over (one GPU each, or CPU processes)
    batch_methods: str | None = None  # "1=none,ddtree:64 8,32=none,ddtree:4": overrides batch_sizes x methods
    ngram_tokens: int = NGRAM_TOKENS  # prompt-lookup tokens per round of the /ngram methods

    def combos(self) -> list[tuple[int, str]]:
        """(batch size, methods) in run order."""
        if self.batch_methods:
            return parse_batch_methods(self.batch_methods)
        return [(b, self.methods) for b in self.batch_sizes]

    def __post_init__(self) -> None:
        shape(self.shape)
        if self.context < 1:
            raise ValueError(f"--context must be at least 1, got {self.context}")
        if not self.batch_sizes or min(self.batch_sizes) < 1:
            raise ValueError(f"batch sizes must be positive integers, got {self.batch_sizes}")
        if self.rounds < 1:
            raise ValueError(f"--rounds must be at least 1, got {self.rounds}")
        if self.stage_rounds < 0:
            raise ValueError(f"--stage-rounds must be at least 0, got {self.stage_rounds}")
        if not 1 <= self.ngram_tokens <= MAX_NGRAM_TOKENS:
            raise ValueError(f"--ngram-tokens must be in [1, {MAX_NGRAM_TOKENS}], got {self.ngram_tokens}")
        # None: the shape's; anything else is what runs and what the result records
        if self.drafter_layers is not None and self.drafter_layers < 1:
            raise ValueError(f"--drafter-layers must be at least 1, got {self.drafter_layers}")
        if self.block_size is not None and self.block_size < 2:
            raise ValueError(f"--block-size must be at least 2, got {self.block_size}")
        if not (math.isfinite(self.temperature) and self.temperature >= 0):
            raise ValueError(f"--temperature must be >= 0 (0 = greedy), got {self.temperature}")
        if not self.variants:
            raise ValueError("--variants is empty")
        vocab = shape(self.shape).target["vocab_size"]
        for v in self.variants:
            size = Variant.parse(v).draft_vocab
            if size is not None and self.tensor_parallel_size > 1:
                raise ValueError(f"variant {v!r}: a draft vocabulary is timed on one device only")
            if size is not None and size > vocab:
                raise ValueError(f"variant {v!r}: a draft vocabulary of {size} tokens exceeds the "
                                 f"{self.shape} vocabulary's {vocab}")
        for _, methods in self.combos():
            fixed = False
            for m in parse_methods(methods):
                fixed |= m.spec == "ddtree" and m.budget != "auto"
                if m.budget == "auto" and not fixed:
                    raise ValueError("ddtree:auto needs fixed ddtree budgets before it in the same list: "
                                     "its cost profile is made of their measured rounds")
        if isinstance(self.tensor_parallel_size, bool) or not isinstance(self.tensor_parallel_size, int) \
                or self.tensor_parallel_size < 1:
            raise ValueError(f"--tensor-parallel-size must be a positive integer, got {self.tensor_parallel_size!r}")


@dataclass(frozen=True)
class SyntheticTarget:
    """A tensor-parallel target source (see parallel/rank.py: CheckpointTarget) with random weights at a
    shape: each rank builds only its shard; the drafter is replicated, the same on every rank (same seed)."""

    target: ModelConfig
    drafter_config: DrafterConfig | None
    seed: int = 0

    def load(self, device: torch.device, dtype: torch.dtype, shard):
        return build_target(self.target, device, dtype, seed=self.seed, shard=shard), self.target

    def tokenizer(self):
        return None

    def drafter(self, draft_model: str | None, device: torch.device, dtype: torch.dtype):
        if self.drafter_config is None:
            return None
        return build_drafter(self.drafter_config, device, dtype, seed=self.seed + 1)


def _verified(method, depth: int, cfg: SyntheticConfig) -> int:
    """Rows a round of `method` verifies per slot: the root, its draft nodes and a /ngram method's lookup."""
    return 1 + method.nodes(depth) + (cfg.ngram_tokens if method.ngram else 0)


def _logits_gib(batch: int, nodes: int, vocab: int) -> float:
    return batch * nodes * vocab * 4 / 2 ** 30


def run_synthetic(cfg: SyntheticConfig, command: str | None = None, log=print, progress=None,
                  debug: bool = False) -> dict:
    """Time rounds for every (batch size, method) of `cfg`; returns the result dict (JSON-ready).

    progress: called with the result so far ("complete": false) after every combination.
    debug: log a failing combination's traceback, not just its error line.
    """
    from treeflash.llm import _device, _dtype

    device = _device(cfg.device)
    dtype = _dtype(cfg.dtype, device)
    s = shape(cfg.shape)
    tcfg = target_config(s)
    dcfg = drafter_config(tcfg, s.drafter_layers if cfg.drafter_layers is None else cfg.drafter_layers,
                          s.block_size if cfg.block_size is None else cfg.block_size, s.mask_token_id,
                          s.target_layer_ids)
    combos = [(b, m) for b, methods in cfg.combos() for m in parse_methods(methods)]
    methods = [m for _, m in combos]
    longest = cfg.context + 1 + max(max(_verified(m, dcfg.depth, cfg), dcfg.block_size) for m in methods)
    if longest > tcfg.max_position_embeddings:
        raise ValueError(f"--context {cfg.context} plus a round exceeds the shape's "
                         f"{tcfg.max_position_embeddings} positions")

    tp = cfg.tensor_parallel_size
    gen = torch.Generator().manual_seed(cfg.seed)
    prompt = torch.randint(0, tcfg.vocab_size, (cfg.context,), generator=gen).tolist()
    one_device_ar: list[dict] = []
    if tp > 1:
        from treeflash.models.parallel import check_shardable

        check_shardable(tcfg, tp)  # before anything is built
        one_device_ar = _one_device_ar(tcfg, cfg, device, dtype, prompt, log)

    needs_drafter = any(m.spec != "none" for m in methods)
    group, make_engine = None, Engine
    if tp == 1:
        check_weights_fit(cfg.shape, target_params(tcfg) + (drafter_params(dcfg) if needs_drafter else 0), device,
                          dtype)
        log(f"building {cfg.shape} (random {str(dtype).removeprefix('torch.')} weights) on {device} ...")
        target = build_target(tcfg, device, dtype, seed=cfg.seed)
        drafter = build_drafter(dcfg, device, dtype, seed=cfg.seed + 1) if needs_drafter else None
    else:
        from treeflash.parallel import TensorParallel

        log(f"building {cfg.shape} (random {str(dtype).removeprefix('torch.')} weights) split over {tp} ranks "
            f"from {device} ...")
        source = SyntheticTarget(tcfg, dcfg if needs_drafter else None, cfg.seed)
        group = TensorParallel(tp, source, device, dtype)
        target = group.model  # rank 0's shard
        drafter = source.drafter(None, device, dtype)

        def make_engine(target, drafter, spec, tokenizer, config):
            return group.engine(drafter, None, spec, tokenizer, config)
    try:
        return _run_rows(cfg, s, tcfg, dcfg, methods, target, drafter, make_engine, group, one_device_ar, prompt,
                         device, dtype, command, log, progress, debug)
    finally:
        if group is not None:
            group.close()


def check_weights_fit(name: str, params: int, device: torch.device, dtype: torch.dtype) -> None:
    """A clear error before building weights the device cannot hold (the CPU's way of running out is the
    process killed without a word): their bytes against the device's free memory, where it can be read."""
    need = params * dtype.itemsize
    free = free_memory(device)
    if free is not None and need > free:
        raise ValueError(f"--synthetic {name}: its random {str(dtype).removeprefix('torch.')} weights take "
                         f"{need / 1e9:.1f} GB, and {device} has {free / 1e9:.1f} GB free (a smaller shape, "
                         f"--dtype bfloat16, or a larger device)")


def free_memory(device: torch.device) -> int | None:
    """Bytes free on `device`: CUDA's free memory, the CPU's MemAvailable (Linux); None where unknown."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def _run_rows(cfg, s, tcfg, dcfg, methods, target, drafter, make_engine, group, one_device_ar, prompt, device,
              dtype, command, log, progress, debug=False) -> dict:
    bandwidth = copy_bandwidth(device)
    target_bytes = weight_bytes(target)
    read_bytes = decode_read_bytes(target)  # (a mixture of experts: a token's experts only)
    drafter_bytes = weight_bytes(drafter) if drafter is not None else 0
    floor_ms = 1e3 * read_bytes / bandwidth  # with tensor parallelism: rank 0's shard
    log(f"  target {target_bytes / 1e9:.2f} GB" + (f" ({read_bytes / 1e9:.2f} GB read per token)"
                                                   if read_bytes != target_bytes else "")
        + f", drafter {drafter_bytes / 1e9:.2f} GB, copy bandwidth {bandwidth / 1e9:.1f} GB/s -> weight-read floor "
        f"{floor_ms:.3f} ms per step")

    env = environment(device, dtype, command)

    def snapshot(complete: bool) -> dict:
        result = {
            "kind": "synthetic",
            "complete": complete,
            "environment": env,
            "shape": cfg.shape,
            "config": asdict(cfg),
            "target": {**s.target, "parameters": sum(p.numel() for p in target.parameters()), "weight_bytes": target_bytes},
            "drafter": None if drafter is None else {**dcfg.to_hf(), "parameters": sum(p.numel() for p in drafter.parameters()),
                                                     "weight_bytes": drafter_bytes},
            "copy_bandwidth_bytes_per_s": bandwidth,
            "floor_ms": floor_ms,
            "decode_read_bytes": read_bytes,
            "floor_note": "target weight bytes / measured device-to-device copy bandwidth (read + write counted)"
                          + ("; a mixture of experts: only the experts one token uses (decode_read_bytes)"
                             if read_bytes != target_bytes else "")
                          + ("; tensor parallel: rank 0's shard, the replicated embedding and head counted whole"
                             if group is not None else ""),
            "tensor_parallel": None if group is None else {
                "size": cfg.tensor_parallel_size,
                "devices": [str(group.plan.device_of(r)) for r in range(cfg.tensor_parallel_size)],
                "target_note": "target.parameters and weight_bytes are rank 0's shard's",
                "one_device_ar": one_device_ar,
                "goals": _goals(rows, one_device_ar),
                "note": "rows: rank 0's clock over the mirrored tensor-parallel engine; one_device_ar: the whole "
                        "target on rank 0's device, same shape, weights, context and rounds, timed first in this run",
            },
            "timing_note": "round_ms: wall time of Engine.step() with every slot running a request (one round and its "
                           "host synchronisation), steps back to back, each from the end of the one before, median "
                           "over --rounds steps after warm-up; stage_ms: a separate engine with the per-stage clock on",
            "rows": rows,
            "skipped": skipped,
            "errors": errors,
            "notes": ["random weights: times are per-round costs; acceptance lengths of random models mean nothing"],
        }
        return result

    rows, skipped, errors = [], [], []
    combos = [(b, m) for b, listed in cfg.combos() for m in parse_methods(listed)]
    variants = [Variant.parse(v) for v in cfg.variants]
    runs = [(b, m, v) for b, m in combos for v in variants]
    profiles = tempfile.TemporaryDirectory(prefix="treeflash-profiles-")  # ddtree:auto's cost profiles
    bar = tqdm(runs, desc=f"synthetic {cfg.shape}", unit="combo", file=sys.stderr, dynamic_ncols=True)
    for batch, method, variant in bar:
        where = {"batch": batch, "method": method.label, "variant": variant.label}
        bar.set_postfix_str(f"batch {batch} {method.label} {variant.label}")
        if group is not None and group.failure is not None:
            # A rank that stopped mid-round left the others out of step: the group is shut down and
            # nothing further can run on it (the failure is in "errors").
            skipped.append({**where, "reason": "the tensor-parallel group stopped"})
            continue
        if progress is not None:
            progress(snapshot(complete=False))  # what is measured so far survives a run cut short
        nodes = _verified(method, dcfg.depth, cfg)
        need = _logits_gib(batch, nodes if method.spec == "none" else max(nodes, dcfg.block_size), tcfg.vocab_size)
        if need > cfg.max_logits_gib:
            skipped.append({**where, "reason": f"full-vocabulary logits need {need:.1f} GiB > --max-logits-gib "
                                               f"{cfg.max_logits_gib}"})
            continue
        options = variant.engine_options()
        if method.budget == "auto":
            options["budget_profile"] = _auto_profile(rows, batch, variant, device, Path(profiles.name))
        try:
            # The stage split (a second engine, its own prefill and capture) only for the first variant.
            stage_rounds = cfg.stage_rounds if variant == variants[0] else 0
            with _draft_vocab(drafter, variant.draft_vocab, tcfg.vocab_size):
                timing, prefill_s = _time_one(target, drafter, method, batch, prompt, cfg, stage_rounds, options,
                                              make_engine)
        except torch.OutOfMemoryError:
            skipped.append({**where, "reason": "out of device memory"})
            continue
        except Exception as e:  # noqa: BLE001 - keep the other combinations' results
            errors.append({**where, "error": f"{type(e).__name__}: {e}"})
            log(f"  batch {batch} {method.label} {variant.label} FAILED:\n{traceback.format_exc()}" if debug else
                f"  batch {batch} {method.label} {variant.label} FAILED: {type(e).__name__}: {e}")
            continue
        finally:
            _free(device)
        rows.append({**where, "spec": method.spec, "budget": method.budget, "sync": method.sync,
                     "ngram_tokens": cfg.ngram_tokens if method.ngram else 0, "nodes": nodes,
                     "round_ms": timing.median_ms, "round_ms_p10": timing.quantile_ms(0.1),
                     "round_ms_p90": timing.quantile_ms(0.9), "round_ms_all": timing.round_ms,
                     "stage_ms": timing.stage_ms, "prefill_ms": 1e3 * prefill_s, "setup_s": timing.setup_s,
                     "auto_budget": timing.auto_budget})
        chosen = "" if timing.auto_budget is None else f", auto chose {timing.auto_budget}" + (
            " (no draft)" if timing.auto_budget == 0 else "")
        log(f"  batch {batch} {method.label} [{variant.label}]: {timing.median_ms:.3f} ms per round "
            f"(setup incl. compile + capture {timing.setup_s:.1f} s{chosen})")
        _add_ratios(rows, floor_ms)
    bar.close()
    profiles.cleanup()
    if group is not None and group.failure is not None:
        errors.append({"batch": None, "method": None, "error": f"TensorParallelError: {group.failure}"})
    return snapshot(complete=True)


def _auto_profile(rows: list[dict], batch: int, variant: Variant, device: torch.device, folder: Path) -> str:
    """A CostProfile file of the fixed ddtree rounds measured so far at this batch and variant."""
    seconds = {r["budget"]: r["round_ms"] / 1e3 for r in rows
               if r["batch"] == batch and r["variant"] == variant.label and r["spec"] == "ddtree"
               and isinstance(r["budget"], int)}
    if not seconds:
        raise ValueError(f"ddtree:auto at batch {batch} [{variant.label}]: no fixed budget measured before it")
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    path = folder / f"b{batch}-{variant.label.replace('/', '-')}.json"
    path.write_text(json.dumps({"device": name, "seconds": {str(batch): {str(b): c for b, c in seconds.items()}}}))
    return str(path)


@contextmanager
def _draft_vocab(drafter, size: int | None, vocab_size: int):
    """The drafter drafts over the first `size` token ids while timed (random weights: which ids is immaterial)."""
    if drafter is None or size is None:
        yield
        return
    if size > vocab_size:
        raise ValueError(f"a draft vocabulary of {size} tokens exceeds the target's {vocab_size}")
    before, drafter.draft_vocab = drafter.draft_vocab, DraftVocab(tuple(range(size)))
    try:
        yield
    finally:
        drafter.draft_vocab = before


def _time_one(target, drafter, method, batch, prompt, cfg: SyntheticConfig, stage_rounds: int, options: dict,
              make_engine=Engine):
    params = SamplingParams(temperature=cfg.temperature, max_tokens=1 << 20, ignore_eos=True)
    if method.sync:
        options = {**options, "overlap": False}
    return time_engine_rounds(target, drafter if method.spec != "none" else None, method.spec_config(cfg.ngram_tokens),
                              batch, prompt, params, cfg.rounds, cfg.warmup, stage_rounds, seed=cfg.seed,
                              make_engine=make_engine, **options)


def _one_device_ar(tcfg, cfg: SyntheticConfig, device, dtype, prompt, log) -> list[dict]:
    """The AR step of the whole target on rank 0's device at each batch size (the tensor-parallel
    comparison's denominator), built, timed and freed before the group starts."""
    log(f"building {cfg.shape} whole on {device} for the one-device AR step ...")
    target = build_target(tcfg, device, dtype, seed=cfg.seed)
    none = parse_methods("none")[0]
    out = []
    try:
        for batch in sorted({b for b, _ in cfg.combos()}):
            try:
                timing, _ = _time_one(target, None, none, batch, prompt, cfg, 0, {})
            except torch.OutOfMemoryError:
                out.append({"batch": batch, "round_ms": None, "reason": "out of device memory"})
                continue
            finally:
                _free(device)
            out.append({"batch": batch, "round_ms": timing.median_ms, "round_ms_p10": timing.quantile_ms(0.1),
                        "round_ms_p90": timing.quantile_ms(0.9), "round_ms_all": timing.round_ms})
            log(f"  one-device AR step, batch {batch}: {timing.median_ms:.3f} ms")
    finally:
        del target
        _free(device)
    return out


def _goals(rows: list[dict], one_device_ar: list[dict]) -> list[dict]:
    """Per batch size: the tensor-parallel AR step against one device's, and DDTree:64 against the former
    (issue 11's goals: <= 0.65 and <= 1.4)."""
    single = {r["batch"]: r["round_ms"] for r in one_device_ar}
    out = []
    for batch in sorted({r["batch"] for r in rows}):
        ar = next((r["round_ms"] for r in rows if r["batch"] == batch and r["spec"] == "none"
                   and not r.get("ngram_tokens")), None)
        tree = next((r["round_ms"] for r in rows if r["batch"] == batch and r["method"] == "ddtree:64"), None)
        one = single.get(batch)
        out.append({"batch": batch, "tp_ar_ms": ar, "one_device_ar_ms": one,
                    "ar_ratio": ar / one if ar is not None and one else None,
                    "ddtree64_ms": tree, "ddtree64_x_tp_ar": tree / ar if tree is not None and ar else None})
    return out


def _add_ratios(rows: list[dict], floor_ms: float) -> None:
    # Our AR step: `none` without prompt lookup (none/ngram is a speculative method like the others).
    ar = {(r["batch"], r.get("variant"), r.get("sync", False)): r["round_ms"] for r in rows
          if r["spec"] == "none" and not r.get("ngram_tokens")}
    for r in rows:
        key = (r["batch"], r.get("variant"), r.get("sync", False))  # (a /sync method against none/sync)
        r["x_floor"] = r["round_ms"] / floor_ms if floor_ms > 0 else None
        r["x_ar"] = r["round_ms"] / ar[key] if key in ar else None
        total = sum(r["stage_ms"].values())
        overhead = sum(v for k, v in r["stage_ms"].items() if k in ("tree", "derive_walk", "commit"))
        r["tree_derive_walk_commit_share"] = overhead / total if total > 0 else None


def _free(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def format_synthetic(result: dict) -> str:
    """The result as a text table, one block per batch size."""
    lines = [f"{result['shape']} ({result['environment']['dtype']}, {result['environment']['device']}, context {result['config']['context']}): weight-read floor "
             f"{result['floor_ms']:.3f} ms (copy bandwidth {result['copy_bandwidth_bytes_per_s'] / 1e9:.0f} GB/s)"]
    rows = result["rows"]
    variants = list(dict.fromkeys(r.get("variant", DEFAULT_VARIANT) for r in rows))
    show_variant = len(variants) > 1 or any(r.get("variant", DEFAULT_VARIANT) != DEFAULT_VARIANT for r in rows)
    names = [r["method"] + (f"={r['auto_budget']}" if r.get("auto_budget") is not None else "") for r in rows]
    w = max([14] + [len(n) for n in names])  # ("ddtree:auto/sync=64")
    header = f"{'batch':>5} {'method':<{w}} " + (f"{'kernels':<12} " if show_variant else "") + \
        f"{'round ms':>9} {'x AR':>6} {'x floor':>8}  " + \
        " ".join(f"{s:>11}" for s in ("draft", "tree", "verify", "derive_walk", "commit"))
    lines.append(header)
    for r, method in zip(rows, names):
        stages = " ".join(f"{r['stage_ms'][s]:>11.3f}" if s in r["stage_ms"] else f"{'-':>11}"
                          for s in ("draft", "tree", "verify", "derive_walk", "commit"))
        x_ar = f"{r['x_ar']:.2f}" if r["x_ar"] is not None else "-"
        variant = f"{r.get('variant', DEFAULT_VARIANT):<12} " if show_variant else ""
        lines.append(f"{r['batch']:>5} {method:<{w}} {variant}{r['round_ms']:>9.3f} {x_ar:>6} {r['x_floor']:>8.1f}  {stages}")
    if len(variants) > 1:
        lines += _variant_pivot(rows, variants)
    for s in result["skipped"]:
        lines.append(f"  skipped batch {s['batch']} {s['method']} {s.get('variant', '')}: {s['reason']}")
    for e in result.get("errors", []):
        lines.append(f"  ERROR batch {e['batch']} {e['method']} {e.get('variant', '')}: {e['error']}")
    tp = result.get("tensor_parallel")
    if tp:
        lines.append(f"  tensor parallel over {tp['size']} ranks (rank 0's clock); goals: AR ratio <= 0.65, "
                     f"ddtree:64 <= 1.4x the TP AR step")
        for g in tp["goals"]:
            def ms(v):
                return "-" if v is None else f"{v:.3f}"

            def x(v):
                return "-" if v is None else f"{v:.2f}"

            lines.append(f"  batch {g['batch']}: AR step {ms(g['tp_ar_ms'])} ms vs one device "
                         f"{ms(g['one_device_ar_ms'])} ms -> ratio {x(g['ar_ratio'])}; ddtree:64 "
                         f"{ms(g['ddtree64_ms'])} ms = {x(g['ddtree64_x_tp_ar'])}x the TP AR step")
    lines.append("  (stage columns: ms per round, from a separate pass with a synchronised clock per stage;"
                 " ddtree:auto=B: the budget auto chose, 0 a round without a draft)")
    return "\n".join(lines)


def _variant_pivot(rows: list[dict], variants: list[str]) -> list[str]:
    """ms per round side by side per variant, and each variant over the first one."""
    first = variants[0]
    lines = ["", f"kernel variants side by side: ms per round (and / {first})",
             f"{'batch':>5} {'method':<12} " + " ".join(f"{v:>22}" for v in variants)]
    by = {(r["batch"], r["method"], r.get("variant")): r["round_ms"] for r in rows}
    for batch, method in dict.fromkeys((r["batch"], r["method"]) for r in rows):
        base = by.get((batch, method, first))
        cells = []
        for v in variants:
            ms = by.get((batch, method, v))
            ratio = f" ({ms / base:.2f}x)" if ms is not None and base else ""
            cells.append(f"{'-' if ms is None else f'{ms:.3f}'}{ratio}".rjust(22))
        lines.append(f"{batch:>5} {method:<12} " + " ".join(cells))
    return lines



