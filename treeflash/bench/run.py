"""`treeflash bench`: every method on the same prompts through `LLM`, then the side-by-side baselines.

Each method gets its own `LLM` (same weights, same device and dtype), a warm-up call, then one timed
`generate` over all prompts as a batch of up to `batch_size` running requests. Tokens per second are
generated tokens over that call's wall time (prefill included); per-round and per-stage times come
from the requests' metrics. Greedy runs also check that every method emits `none`'s tokens.
"""

from __future__ import annotations

import gc
import math
import sys
import tempfile
import time
import traceback
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from tqdm import tqdm

from treeflash.attention import BACKENDS
from treeflash.bench.baselines import BASELINES, BaselineError, RefSetup, build_baseline, load_hf_target, parse_baselines
from treeflash.bench.datasets import Prompt, load_prompts
from treeflash.bench.methods import NGRAM_TOKENS, Method, budgets_of, parse_methods
from treeflash.bench.report import environment
from treeflash.round import MAX_NGRAM_TOKENS, STAGES, TREE_BUILDERS

DEFAULT_METHODS = "none,dflash,ddtree:16,ddtree:64,ddtree:256"


@dataclass(frozen=True)
class BenchConfig:
    model: str | None = None  # HF directory, Hub repository id or .gguf; None = the embedded SmolLM2-135M-Instruct
    revision: str | None = None  # a Hub model's branch, tag or commit (None: its main branch)
    draft_model: str | None = None
    random_drafter: bool = False  # build a random drafter of the target's width (timing only)
    drafter_layers: int = 5
    block_size: int = 16
    mask_token_id: int | None = None  # random drafter's MASK id (default: the last vocabulary id)
    dataset: str = "humaneval"
    num_prompts: int | None = 8
    max_tokens: int = 128
    temperature: float = 0.0
    methods: str | None = None  # default: DEFAULT_METHODS with a drafter, "none" without
    batch_size: int = 1
    device: str | None = None
    dtype: str | None = None
    max_model_len: int | None = None
    seed: int = 0
    ignore_eos: bool = False
    warmup: int = 1  # warm-up prompts per method (not timed)
    stage_prompts: int = 2  # on CUDA: prompts of an extra pass with the per-stage clock on
    baselines: str | None = None  # "hf,dflash-ref,ddtree-ref"
    baseline_prompts: int | None = None  # default: every prompt
    ddtree_ref: str | None = None
    ref_budget: int | None = None  # ddtree-ref's budget (default: the first ddtree:B of the methods, else 64)
    hf_compile: bool = True  # transformers compiles its static-cache decode step on CUDA unless this is off
    tensor_parallel_size: int = 1  # each method's LLM splits the target over this many ranks
    cuda_graph_sizes: tuple[int, ...] | None = None  # batch buckets captured (default: powers of two)
    draft_vocab: bool = True  # use the drafter's draft vocabulary when it ships one
    attention: str | None = None  # "sdpa", "flex", "splitkv", "hybrid" (treeflash/attention.py); None: the default
    tree_builder: str = "auto"  # DDTree's builder on CUDA: "kernel", "ops" or "auto" (LLM(tree_kernel=...))
    ngram_tokens: int = NGRAM_TOKENS  # prompt lookup per round of the /ngram methods (LLM(ngram_tokens=...))
    # LLM(enable_prefix_caching=...) of our methods: off, so that no timed prompt starts from rows its warm-up
    # (or a run before) prefilled, which the baselines could not do
    prefix_caching: bool = False

    def __post_init__(self) -> None:
        for name in ("max_tokens", "batch_size", "drafter_layers"):
            if getattr(self, name) < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be at least 1, got {getattr(self, name)}")
        if self.block_size < 2:
            raise ValueError(f"--block-size must be at least 2, got {self.block_size}")
        for name in ("baseline_prompts", "ref_budget"):  # None: every prompt / the first ddtree:B
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be at least 1, got {getattr(self, name)}")
        if not (math.isfinite(self.temperature) and self.temperature >= 0):
            raise ValueError(f"--temperature must be >= 0 (0 = greedy), got {self.temperature}")
        if not 1 <= self.ngram_tokens <= MAX_NGRAM_TOKENS:
            raise ValueError(f"--ngram-tokens must be in [1, {MAX_NGRAM_TOKENS}], got {self.ngram_tokens}")
        if self.draft_model and self.random_drafter:
            raise ValueError("give either --draft-model or --random-drafter, not both")
        if self.warmup < 0 or self.stage_prompts < 0:
            raise ValueError("--warmup and --stage-prompts must be >= 0")
        parse_methods(self.method_list)
        parse_baselines(self.baselines)
        if self.tree_builder not in TREE_BUILDERS:
            raise ValueError(f"--tree-builder must be one of {', '.join(TREE_BUILDERS)}, got {self.tree_builder!r}")
        if self.attention is not None and self.attention not in BACKENDS:
            raise ValueError(f"--attention must be one of {', '.join(BACKENDS)}, got {self.attention!r}")
        if self.tensor_parallel_size != 1 and self.baselines:
            raise ValueError("--baselines run on one device: drop them or --tensor-parallel-size")

    @property
    def drafter_dir(self) -> str | None:
        """The drafter of the speculative methods: --draft-model, or with the embedded default target (no
        --model) the shipped drafter, as `LLM()` and `treeflash generate` pick it; None with --random-drafter
        (built per run) or a --model given without one."""
        if self.random_drafter:
            return None
        from treeflash.default_model import default_draft_model

        drafter = default_draft_model(self.model, self.draft_model, None)
        return None if drafter is None else str(drafter)

    @property
    def has_drafter(self) -> bool:
        return self.drafter_dir is not None or self.random_drafter

    @property
    def method_list(self) -> str:
        return self.methods or (DEFAULT_METHODS if self.has_drafter else "none")


def run_bench(cfg: BenchConfig, command: str | None = None, log=print, progress=None, debug: bool = False) -> dict:
    """Run every method (and baseline) of `cfg`; returns the result dict (JSON-ready).

    progress: called with the result so far (marked "complete": false) after every method and
    baseline, so a run cut short (a time limit, a crash) still leaves what it measured.
    debug: log a failing method's or baseline's traceback, not just its error line.
    """
    from treeflash.checkpoint import resolve_model_dir
    from treeflash.config import ModelConfig
    from treeflash.llm import _device, _dtype

    methods = parse_methods(cfg.method_list)
    baselines = parse_baselines(cfg.baselines)
    needs_drafter = any(m.spec != "none" for m in methods) or any(BASELINES[b] != "none" for b in baselines)
    if needs_drafter and not cfg.has_drafter:
        raise ValueError("these methods need a drafter: pass --draft-model DIR, or --random-drafter for timing "
                         "with a random one")
    device = _device(cfg.device)
    dtype = _dtype(cfg.dtype, device)
    prompts = load_prompts(cfg.dataset, cfg.num_prompts)
    model_dir = resolve_model_dir(cfg.model, cfg.revision)
    r = {"kind": "bench", "complete": False, "environment": environment(device, dtype, command), "config": asdict(cfg),
         "model": str(model_dir), "drafter": {"path": cfg.drafter_dir} if cfg.drafter_dir and needs_drafter else None,
         "dataset": cfg.dataset, "num_prompts": len(prompts), "prompt_ids": [p.id for p in prompts],
         "notes": _notes(cfg, device, baselines, needs_drafter), "methods": [], "skipped": [], "baselines": [],
         "skipped_baselines": [], "errors": []}
    report = progress or (lambda result: None)
    with tempfile.TemporaryDirectory(prefix="treeflash-bench-") as tmp:
        drafter_dir = cfg.drafter_dir
        if cfg.random_drafter and needs_drafter:
            drafter_dir, r["drafter"] = _random_drafter(ModelConfig.from_dir(model_dir), cfg, Path(tmp))
        runs, ids, eos = [], None, []
        bar = tqdm(methods, desc="methods", unit="method", file=sys.stderr, dynamic_ncols=True)
        for method in bar:
            bar.set_postfix_str(method.label)
            llm = _make_llm(cfg, method, drafter_dir, device, dtype)
            if ids is None:
                ids, eos = [_encode(llm, p) for p in prompts], sorted(llm.eos_token_ids)
                _check_lengths(prompts, ids, llm.max_model_len)  # before anything is measured
            try:
                run = _run_method(llm, method, ids, cfg, log)
                stages_timed = llm.engine.config.time_stages
                del llm
                _free(device)
                if not stages_timed and cfg.stage_prompts:
                    # The per-stage clock synchronises (or splits a CUDA graph) at every stage: its own
                    # engine, on a few prompts, after the timed run.
                    llm = _make_llm(cfg, method, drafter_dir, device, dtype, time_stages=True)
                    run["stage_outs"] = _stage_pass(llm, ids, cfg)
                runs.append(run)
            except Exception as e:  # noqa: BLE001 - one failing method must not lose the others' results
                r["errors"].append({"method": method.label, "error": f"{type(e).__name__}: {e}"})
                log(_failed(method.label, e, debug))
            llm = None
            _free(device)
            r["methods"] = _summarise(runs, cfg)
            report(r)
        bar.close()
        if baselines and ids is not None:
            _run_baselines(baselines, model_dir, drafter_dir, ids, eos, methods, cfg, device, dtype, log, r, report,
                           debug)
    r["complete"] = True
    return r


def _failed(label: str, e: Exception, debug: bool) -> str:
    # One line, as the CLI's errors are; the traceback only when asked for (--debug, TREEFLASH_DEBUG=1).
    return f"  {label} FAILED:\n{traceback.format_exc()}" if debug else f"  {label} FAILED: {type(e).__name__}: {e}"


def _check_lengths(prompts: list[Prompt], ids: list[list[int]], max_model_len: int) -> None:
    """A prompt the engine would refuse fails every method alike: say which, once, before timing any."""
    for p, t in zip(prompts, ids):
        if not t:
            raise ValueError(f"prompt {p.id!r} encodes to no tokens")
        if len(t) >= max_model_len:
            raise ValueError(f"prompt {p.id!r} has {len(t)} tokens; the context (--max-model-len) is {max_model_len} "
                             "and at least one token must fit after the prompt")


def _notes(cfg: BenchConfig, device: torch.device, baselines: list[str], needs_drafter: bool) -> list[str]:
    notes = []
    if cfg.random_drafter and needs_drafter:
        notes.append(f"RANDOM DRAFTER ({cfg.drafter_layers} layers, block {cfg.block_size}, random weights): "
                     "acceptance is about 1 token per round, so speculative methods cannot speed anything up "
                     "here; the numbers measure per-round cost (timing only)")
    if device.type == "cpu":
        notes.append("CPU run: eager PyTorch on a CPU says little about GPU speed")
    if baselines and cfg.batch_size > 1:
        notes.append(f"the baselines run one prompt at a time; ours ran {cfg.batch_size} side by side, so the "
                     "side-by-side rates compare per-request speed inside a shared batch")
    if baselines and cfg.temperature >= 1e-5:
        notes.append("the baselines decode greedily (as the references do) while ours sampled: compare speed only")
    return notes


# --- our methods -----------------------------------------------------------------------------------
def _random_drafter(target_cfg, cfg: BenchConfig, tmp: Path) -> tuple[str, dict]:
    from treeflash.bench.shapes import build_drafter, drafter_config
    from treeflash.models.dflash import save_drafter

    dcfg = drafter_config(target_cfg, cfg.drafter_layers, cfg.block_size, cfg.mask_token_id)
    path = save_drafter(build_drafter(dcfg, "cpu", torch.float32, seed=cfg.seed + 1), tmp / "random-drafter")
    return str(path), {"kind": "random", "layers": cfg.drafter_layers, "block_size": cfg.block_size,
                       "mask_token_id": dcfg.mask_token_id, "target_layer_ids": list(dcfg.target_layer_ids)}


def _make_llm(cfg: BenchConfig, method: Method, drafter_dir, device, dtype, time_stages=None):
    from treeflash import LLM

    return LLM(cfg.model, device=device, dtype=dtype, max_model_len=cfg.max_model_len,
               draft_model=drafter_dir if method.spec != "none" else None, max_num_seqs=cfg.batch_size,
               time_stages=time_stages, tensor_parallel_size=cfg.tensor_parallel_size,
               cuda_graph_sizes=cfg.cuda_graph_sizes, draft_vocab=cfg.draft_vocab, attention=cfg.attention,
               tree_kernel=TREE_BUILDERS[cfg.tree_builder], enable_prefix_caching=cfg.prefix_caching,
               **method.llm_kwargs(cfg.ngram_tokens))


def _encode(llm, prompt: Prompt) -> list[int]:
    if prompt.is_chat:
        return llm.chat_token_ids(list(prompt.messages))
    if llm.tokenizer is None:
        raise ValueError(f"{llm.model_dir} has no tokenizer: text prompts cannot be encoded")
    return llm.tokenizer.encode(prompt.text)


def _params(cfg: BenchConfig, n: int, max_tokens: int | None = None):
    from treeflash import SamplingParams

    return [SamplingParams(temperature=cfg.temperature, max_tokens=max_tokens or cfg.max_tokens, seed=cfg.seed + i,
                           ignore_eos=cfg.ignore_eos) for i in range(n)]


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _run_method(llm, method: Method, ids: list[list[int]], cfg: BenchConfig, log) -> dict:
    if cfg.warmup:
        # Every graph the timed run can replay (each batch bucket up to the batch size), captured now:
        # a capture costs seconds, which a warm-up generate does not reliably cover (its short requests
        # may never fill the larger buckets) and which would otherwise be timed.
        llm.engine.capture_graphs(cfg.batch_size, _params(cfg, 1)[0])
        # At least a full batch, so whatever the engine builds per batch size is built before timing.
        n = min(max(cfg.warmup, cfg.batch_size), len(ids))
        llm.generate(prompt_token_ids=ids[:n], sampling_params=_params(cfg, n, min(cfg.max_tokens, 8)), use_tqdm=False)
    _sync(llm.device)
    start = time.perf_counter()
    outs = llm.generate(prompt_token_ids=ids, sampling_params=_params(cfg, len(ids)), use_tqdm=True)
    _sync(llm.device)
    wall = time.perf_counter() - start
    tokens = sum(o.metrics.num_generated_tokens for o in outs)
    log(f"  {method.label}: {tokens} tokens in {wall:.2f} s ({tokens / wall:.1f} tokens/s)")
    speculator = getattr(llm.engine, "speculator", None)  # (a tensor-parallel group's mirror has none)
    return {"method": method, "outs": outs, "wall": wall, "stage_outs": outs,
            "tree_budget": getattr(llm.spec, "tree_budget", None), "attention": getattr(speculator, "attention", None)}


def _stage_pass(llm, ids: list[list[int]], cfg: BenchConfig) -> list:
    n = min(cfg.stage_prompts, len(ids))
    llm.generate(prompt_token_ids=ids[:1], sampling_params=_params(cfg, 1, min(cfg.max_tokens, 8)), use_tqdm=False)
    return llm.generate(prompt_token_ids=ids[:n], sampling_params=_params(cfg, n), use_tqdm=False)


def _summarise(runs: list[dict], cfg: BenchConfig) -> list[dict]:
    base = next((r for r in runs if r["method"].spec == "none" and not r["method"].sync), None)
    base = base or next((r for r in runs if r["method"].spec == "none"), None)
    base_tps = _tps(base) if base else None
    greedy = cfg.temperature < 1e-5
    summaries = []
    for r in runs:
        outs, m = r["outs"], r["method"]
        rounds = sum(o.metrics.rounds for o in outs)
        accepted = [a for o in outs for a in o.metrics.acceptance_lengths]
        stage_rounds = sum(o.metrics.rounds for o in r["stage_outs"]) or 1
        stage_totals = {s: sum(o.metrics.stage_seconds.get(s, 0.0) for o in r["stage_outs"]) for s in STAGES}
        same = None
        if greedy and base is not None:
            same = sum(o.token_ids == b.token_ids for o, b in zip(outs, base["outs"])) / len(outs)
        summaries.append({
            "method": m.label, "spec": m.spec, "budget": m.budget, "sync": m.sync,
            "ngram_tokens": cfg.ngram_tokens if m.ngram else 0, "tree_budget_used": r["tree_budget"],
            "attention": r.get("attention"),
            "tokens_per_second": _tps(r), "wall_seconds": r["wall"],
            "generated_tokens": sum(o.metrics.num_generated_tokens for o in outs), "rounds": rounds,
            "mean_acceptance_length": sum(accepted) / len(accepted) if accepted else 0.0,
            "speedup_vs_none": _tps(r) / base_tps if base_tps else None,
            "decode_ms_per_round": 1e3 * sum(o.metrics.decode_seconds for o in outs) / rounds if rounds else None,
            "prefill_ms_mean": 1e3 * sum(o.metrics.prefill_seconds for o in outs) / len(outs),
            "stage_ms_per_round": {s: 1e3 * v / stage_rounds for s, v in stage_totals.items()
                                   if any(s in o.metrics.stage_seconds for o in r["stage_outs"])},
            "same_tokens_as_none": same,
            # tree_budget="auto": how many request-rounds ran at each budget (0: no draft)
            "auto_budget_rounds": _budget_rounds(outs),
            "per_prompt": [{"prompt_tokens": o.metrics.num_prompt_tokens, "generated_tokens": o.metrics.num_generated_tokens,
                            "finish_reason": o.finish_reason, "rounds": o.metrics.rounds,
                            "acceptance_lengths": o.metrics.acceptance_lengths,
                            "prefill_seconds": o.metrics.prefill_seconds, "decode_seconds": o.metrics.decode_seconds,
                            "stage_seconds": o.metrics.stage_seconds, "token_ids": o.token_ids} for o in outs],
        })
    return summaries


def _budget_rounds(outs) -> dict[int, int] | None:
    counts = Counter(b for o in outs for b in o.metrics.round_budgets)
    return {b: counts[b] for b in sorted(counts)} or None


def _tps(run: dict) -> float:
    return sum(o.metrics.num_generated_tokens for o in run["outs"]) / run["wall"] if run["wall"] > 0 else 0.0


def _free(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


# --- baselines -------------------------------------------------------------------------------------
def _run_baselines(names, model_dir, drafter_dir, ids, eos, methods, cfg, device, dtype, log, r, report,
                   debug=False) -> None:
    """Run each baseline on the first --baseline-prompts prompts; results go into r["baselines"]."""
    n = len(ids) if cfg.baseline_prompts is None else min(cfg.baseline_prompts, len(ids))
    budget = cfg.ref_budget if cfg.ref_budget is not None else next(iter(budgets_of(methods)), 64)
    setup = RefSetup(device=device, dtype=dtype, max_tokens=cfg.max_tokens,
                     stop_token_ids=None if cfg.ignore_eos else list(eos),
                     drafter_dir=Path(drafter_dir) if drafter_dir else None,
                     ddtree_ref=Path(cfg.ddtree_ref) if cfg.ddtree_ref else None, tree_budget=budget,
                     hf_compile=cfg.hf_compile)
    target = load_hf_target(model_dir, device, dtype)
    for name in names:
        ours_label = BASELINES[name] if BASELINES[name] != "ddtree" else f"ddtree:{budget}"
        ours = next((s for s in r["methods"] if s["method"] == ours_label), None)
        try:
            baseline = build_baseline(name, target, setup, max(len(p) for p in ids[:n]))
        except BaselineError as e:
            r["skipped_baselines"].append({"name": name, "reason": str(e)})
            log(f"  {name}: skipped ({e})")
            continue
        source = baseline.source
        try:
            baseline(ids[0])  # warm-up (and, for hf on CUDA, transformers' compilation of the decode step)
            runs = [baseline(p) for p in tqdm(ids[:n], desc=name, unit="prompt", file=sys.stderr, dynamic_ncols=True)]
        except Exception as e:  # noqa: BLE001 - third-party code: record it, keep the other results
            r["errors"].append({"baseline": name, "error": f"{type(e).__name__}: {e}"})
            log(_failed(name, e, debug))
            continue
        finally:
            del baseline
            _free(device)
        r["baselines"].append({**_baseline_summary(name, ours_label, ours, runs, n, budget), "source": source})
        log(f"  {name}: {r['baselines'][-1]['tokens_per_second']:.1f} tokens/s")
        report(r)


def _baseline_summary(name, ours_label, ours, runs, n, budget) -> dict:
    tokens = sum(len(r.token_ids) for r in runs)
    seconds = sum(r.seconds for r in runs)
    accepted = [a for r in runs for a in (r.acceptance_lengths or [])]
    rounds = len(accepted) if accepted else tokens  # plain generate: one round per token
    decode = [r.decode_seconds for r in runs]
    split = all(d is not None for d in decode)  # transformers' generate reports no prefill/decode split
    ms_per_round = 1e3 * sum(decode) / rounds if split and rounds else (1e3 * seconds / tokens if tokens else None)
    ours_prompts = ours["per_prompt"][:n] if ours else None
    ours_tps = ours_ms = same = None
    if ours_prompts:
        # Ours at batch size 1 and theirs, over the same prompts; ours timed per request (prefill + decode).
        ours_tokens = sum(p["generated_tokens"] for p in ours_prompts)
        ours_time = sum(p["prefill_seconds"] + p["decode_seconds"] for p in ours_prompts)
        ours_rounds = sum(p["rounds"] for p in ours_prompts)
        ours_tps = ours_tokens / ours_time if ours_time > 0 else None
        ours_ms = 1e3 * sum(p["decode_seconds"] for p in ours_prompts) / ours_rounds if ours_rounds else None
        same = sum(r.token_ids == p["token_ids"] for r, p in zip(runs, ours_prompts)) / n
    tps = tokens / seconds if seconds > 0 else 0.0
    return {"name": name, "ours": ours_label, "num_prompts": n, "tree_budget": budget if name == "ddtree-ref" else None,
            "tokens_per_second": tps, "generated_tokens": tokens, "seconds": seconds,
            "ms_per_round": ms_per_round, "ms_per_round_includes_prefill": not split,
            "mean_acceptance_length": sum(accepted) / len(accepted) if accepted else None,
            "ours_tokens_per_second": ours_tps, "ours_ms_per_round": ours_ms,
            "ours_over_ref": ours_tps / tps if ours_tps and tps else None, "same_tokens_as_ours": same,
            "per_prompt": [{"generated_tokens": len(r.token_ids), "seconds": r.seconds,
                            "acceptance_lengths": r.acceptance_lengths} for r in runs]}
