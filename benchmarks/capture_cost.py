"""What a CUDA-graph warm-up costs: `LLM.warm_up` timed (under cProfile unless --no-profile), one JSON report
(+ the profile as text), with the allocator's memory before and after.

`treeflash serve` captures its graphs before it listens (`LLM.warm_up`). This script times one warm-up and says
which functions the seconds went to (Triton's compiler, dynamo/Inductor, the rounds themselves), so two runs in a
row on one machine show what the caches save, and what the graphs hold in memory
(benchmarks/h200-capture-cost: how it found that a restarted server compiled its kernels again).

    python benchmarks/capture_cost.py --model DIR [--random-weights] [--draft-model DIR] \
        [--max-num-seqs 2] [--sampling greedy,temperature] --out report.json

--random-weights: DIR holds only config.json and the tokenizer; random weights of its shape are written to a
temporary copy first (capture cost depends on shapes, not values).
"""

from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import shutil
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from run_info import run_info  # noqa: E402

from treeflash import LLM, SamplingParams  # noqa: E402

SAMPLING = {"greedy": SamplingParams(temperature=0), "temperature": SamplingParams(temperature=1.0),
            "top_p": SamplingParams(temperature=1.0, top_p=0.9)}


def random_checkpoint(config_dir: Path, out: Path, dtype: torch.dtype) -> Path:
    """A copy of config_dir (config + tokenizer) with random weights of its shape in HF names."""
    from safetensors.torch import save_file

    from treeflash.bench.shapes import build_target
    from treeflash.config import ModelConfig

    shutil.copytree(config_dir, out, dirs_exist_ok=True)
    model = build_target(ModelConfig.from_dir(config_dir), "cpu", dtype)
    save_file({f"model.{k}": v.contiguous() for k, v in model.state_dict().items()}, str(out / "model.safetensors"))
    return out


def memory(device: torch.device) -> dict:
    """The CUDA allocator's GiB now (allocated, reserved, peak reserved); empty off CUDA."""
    if device.type != "cuda":
        return {}
    gib = 2 ** 30
    return {"allocated": round(torch.cuda.memory_allocated(device) / gib, 3),
            "reserved": round(torch.cuda.memory_reserved(device) / gib, 3),
            "max_reserved": round(torch.cuda.max_memory_reserved(device) / gib, 3)}


def memory_after(device: torch.device, before: dict) -> dict:
    """Before and after the warm-up, and after emptying the allocator's cache: the eager warm-up rounds' freed
    blocks stay cached outside the graphs' pool until emptied, so what stays reserved then is what the graphs
    hold (a pool's blocks stay while its graphs live)."""
    if device.type != "cuda":
        return {}
    after = memory(device)
    torch.cuda.empty_cache()
    return {"before_warm_up": before, "after_warm_up": after, "after_empty_cache": memory(device)}


def summarize(stats: pstats.Stats, wall: float) -> dict:
    """Cumulative seconds of the functions that say where a warm-up goes."""
    picks = {
        "triton_compile": ("triton/compiler/compiler.py", "compile"),
        "triton_make_ir": ("triton/compiler/compiler.py", "make_ir"),
        "triton_ptxas": ("triton/backends/nvidia/compiler.py", "make_cubin"),
        "triton_llir": ("triton/backends/nvidia/compiler.py", "make_llir"),
        "triton_load_binary": ("triton/compiler/compiler.py", "_init_handles"),
        "dynamo_compile": ("torch/_dynamo/convert_frame.py", "_compile"),
        "inductor_compile_fx": ("torch/_inductor/compile_fx.py", "compile_fx_inner"),
        "fx_graph_cache_load": ("torch/_inductor/codecache.py", "load_with_key"),
        "cuda_synchronize": ("torch/cuda/__init__.py", "synchronize"),
        "round": ("treeflash/round.py", "round"),
        "capture": ("treeflash/runner.py", "_capture"),
        "capture_prefill": ("treeflash/runner.py", "_capture_prefill"),
        "budget_measure": ("treeflash/budget.py", "measure"),
    }
    out = {"wall_s": round(wall, 2)}
    for name, (path, func) in picks.items():
        calls, cum = 0, 0.0
        for (file, _, fn), (cc, nc, tt, ct, callers) in stats.stats.items():
            if fn == func and file.replace("\\", "/").endswith(path):
                calls += nc
                cum = max(cum, ct)  # (recursive entries repeat the outermost's time)
        out[name] = {"calls": calls, "cum_s": round(cum, 2)}
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--random-weights", action="store_true")
    ap.add_argument("--draft-model", default=None)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--max-num-seqs", type=int, default=2)
    ap.add_argument("--max-model-len", type=int, default=2048)
    ap.add_argument("--sampling", default="greedy", help="comma list of " + ",".join(SAMPLING))
    ap.add_argument("--tree-budget", default="auto")
    ap.add_argument("--no-profile", action="store_true", help="time only (cProfile slows Python ~1.5-2x)")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)

    dtype = getattr(torch, args.dtype)
    model = Path(args.model)
    tmp = None
    if args.random_weights:
        tmp = Path(tempfile.mkdtemp(prefix="capture_cost_"))
        model = random_checkpoint(model, tmp / "model", dtype)
    budget = args.tree_budget if args.tree_budget == "auto" else int(args.tree_budget)
    t0 = time.perf_counter()
    llm = LLM(str(model), draft_model=args.draft_model, dtype=args.dtype, max_num_seqs=args.max_num_seqs,
              max_model_len=args.max_model_len, tree_budget=budget)
    built = time.perf_counter() - t0
    lines: list[tuple[float, str]] = []
    start = time.perf_counter()

    def log(message: str) -> None:
        lines.append((round(time.perf_counter() - start, 2), message))
        print(f"{lines[-1][0]:8.2f} {message}", file=sys.stderr, flush=True)

    llm.engine.runner.log = log
    params = [SAMPLING[name] for name in args.sampling.split(",")]
    before = memory(llm.device)
    profiler = None if args.no_profile else cProfile.Profile()
    start = time.perf_counter()
    if profiler is not None:
        profiler.enable()
    graphs = llm.warm_up(params)
    if profiler is not None:
        profiler.disable()
    wall = time.perf_counter() - start
    report = {"command": " ".join(sys.argv), **run_info(llm.device), "graphs": graphs, "build_s": round(built, 2),
              "warm_up_s": round(wall, 2), "memory_gib": memory_after(llm.device, before), "captures": lines}
    out = Path(args.out)
    if profiler is not None:
        stats = pstats.Stats(profiler)
        report["profile"] = summarize(stats, wall)
        with open(out.with_suffix(".txt"), "w") as f:
            stats.stream = f
            stats.sort_stats("cumulative").print_stats(60)
            stats.sort_stats("tottime").print_stats(30)
    out.write_text(json.dumps(report, indent=1))
    print(json.dumps({k: v for k, v in report.items() if k != "captures"}, indent=1))
    if tmp is not None:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
