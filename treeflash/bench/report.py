"""What a benchmark result records about where it ran, and how it is written and printed."""

from __future__ import annotations

import datetime
import json
import os
import platform
from pathlib import Path

import torch

from treeflash.provenance import git_commit, source_digest
from treeflash.round import STAGES


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    cpu = platform.processor() or platform.machine()
    return f"CPU ({cpu}, {torch.get_num_threads()} torch threads, {os.cpu_count()} cores)"


def environment(device: torch.device, dtype: torch.dtype, command: str | None) -> dict:
    import transformers

    return {
        "command": command,
        "git": git_commit(),
        "source_digest": source_digest(),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "device": device_name(device),
        "device_type": device.type,
        "dtype": str(dtype).removeprefix("torch."),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
    }


def write_json(result: dict, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=1, default=_jsonable) + "\n")
    return path


def _jsonable(value):
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, (torch.dtype, torch.device)):
        return str(value)
    if isinstance(value, (set, frozenset, tuple)):
        return list(value)
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")


def _cell(value, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def _attention_note(methods: list[dict]) -> str:
    """", splitkv attention" when the methods' engines used one backend (older results: nothing)."""
    backends = {m.get("attention") for m in methods} - {None}
    return f", {backends.pop()} attention" if len(backends) == 1 else ""


def _tree_builder_note(config: dict) -> str:
    """", tree builder: ops" when the run forced one (--tree-builder kernel / ops)."""
    builder = config.get("tree_builder", "auto")
    return "" if builder == "auto" else f", tree builder: {builder}"


def format_bench(result: dict) -> str:
    """The methods and baselines as a text table."""
    env = result["environment"]
    lines = [f"{result['dataset']} x {result['num_prompts']} prompts, max {result['config']['max_tokens']} tokens, "
             f"temperature {result['config']['temperature']}, batch size {result['config']['batch_size']} | "
             f"{env['device']}, {env['dtype']}" + _attention_note(result["methods"])
             + _tree_builder_note(result["config"])]
    lines += [f"NOTE: {n}" for n in result["notes"]]
    w = max([13] + [len(m["method"]) for m in result["methods"] + result["skipped"]])  # ("ddtree:auto/sync")
    head = f"{'method':<{w}} {'accept':>6} {'tok/s':>9} {'speedup':>7} {'ms/round':>9} {'same':>6}  " + \
           " ".join(f"{s:>11}" for s in STAGES)
    lines.append(head)
    for m in result["methods"]:
        stages = " ".join(f"{m['stage_ms_per_round'].get(s, 0.0):>11.2f}" for s in STAGES) if m["stage_ms_per_round"] else ""
        lines.append(f"{m['method']:<{w}} {m['mean_acceptance_length']:>6.2f} {m['tokens_per_second']:>9.1f} "
                     f"{_cell(m['speedup_vs_none'], '.2f'):>7} {_cell(m['decode_ms_per_round'], '.2f'):>9} "
                     f"{_cell(m['same_tokens_as_none'], '.0%'):>6}  {stages}")
    for s in result["skipped"]:
        lines.append(f"{s['method']:<{w}} skipped: {s['reason']}")
    for m in result["methods"]:
        if m.get("auto_budget_rounds"):  # (absent from results written before it existed)
            counts = ", ".join(f"{b} x{n}" for b, n in m["auto_budget_rounds"].items())
            lines.append(f"  {m['method']}: request-rounds by budget (0: no draft): {counts}")
    if result["methods"] and result["methods"][0]["stage_ms_per_round"]:
        lines.append("  (accept: tokens per round; same: prompts whose tokens equal `none`'s, greedy only; "
                     "stage columns: ms per round)")
    if result["baselines"]:
        lines.append(f"side by side, batch size 1, {result['baselines'][0]['num_prompts']} prompts:")
        lines.append(f"{'baseline':<24} {'tok/s':>9} {'ours tok/s':>10} {'ours/ref':>8} {'ms/round':>9} "
                     f"{'ours':>7} {'accept':>6} {'same':>6}")
        for b in result["baselines"]:
            lines.append(f"{b['name'] + ' vs ' + b['ours']:<24} {b['tokens_per_second']:>9.1f} "
                         f"{_cell(b['ours_tokens_per_second'], '.1f'):>10} {_cell(b['ours_over_ref'], '.2f'):>8} "
                         f"{_cell(b['ms_per_round'], '.2f') + ('*' if b.get('ms_per_round_includes_prefill') else ''):>9} "
                         f"{_cell(b['ours_ms_per_round'], '.2f'):>7} "
                         f"{_cell(b['mean_acceptance_length'], '.2f'):>6} {_cell(b['same_tokens_as_ours'], '.0%'):>6}")
    if any(b.get("ms_per_round_includes_prefill") for b in result["baselines"]):
        lines.append("  (* whole call / generated tokens: prefill included, as transformers' generate reports no split)")
    for s in result.get("skipped_baselines", []):
        lines.append(f"{s['name']:<24} skipped: {s['reason']}")
    for e in result.get("errors", []):
        lines.append(f"ERROR in {e.get('method') or e.get('baseline')}: {e['error']}")
    return "\n".join(lines)
