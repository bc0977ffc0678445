"""PNG plots of bench results (matplotlib, headless). Each function writes one file and returns its path."""

from __future__ import annotations

from pathlib import Path

from treeflash.round import STAGES

_COLORS = {"draft": "#4C72B0", "tree": "#DD8452", "verify": "#55A868", "derive_walk": "#C44E52", "commit": "#8172B3"}


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")  # no display on servers and GPU machines
    import matplotlib.pyplot as plt

    return plt


def _title(result: dict) -> str:
    """Where it ran, short: the GPU's name or "CPU", the dtype, and a random drafter's label."""
    env = result.get("environment", {})
    parts = ["CPU" if env.get("device_type") == "cpu" else env.get("device", "?"), env.get("dtype", "?")]
    if (result.get("drafter") or {}).get("kind") == "random":
        parts.append("RANDOM drafter: timing only")
    return ", ".join(parts)


def _save(fig, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=110, bbox_inches="tight")  # legends placed outside the axes stay in the picture
    _pyplot().close(fig)
    return path


def plot_bench(result: dict, out_dir: str | Path) -> list[Path]:
    out_dir = Path(out_dir)
    paths = [_speedup_vs_budget(result, out_dir / "speedup_acceptance.png"),
             _acceptance_hist(result, out_dir / "acceptance_hist.png"),
             _stage_split([(m["method"], m["stage_ms_per_round"]) for m in result["methods"]],
                          out_dir / "stage_split.png", f"ms per round by stage ({_title(result)})")]
    if result.get("baselines"):
        paths.append(_baselines(result, out_dir / "baselines.png"))
    return [p for p in paths if p is not None]


def _speedup_vs_budget(result: dict, path: Path) -> Path | None:
    default = [m for m in result["methods"] if not m.get("sync")]  # (a /sync twin would share its budget's point)
    trees = sorted((m for m in default if m["spec"] == "ddtree" and isinstance(m["budget"], int)),
                   key=lambda m: m["budget"])
    # Methods without a budget of their own (the chain, the automatic budget) are level lines across the sweep.
    lines = [(m, label, style) for m, label, style in (
        (next((m for m in default if m["spec"] == "dflash"), None), "dflash (chain)", dict(color="gray", ls="--")),
        (next((m for m in default if m["spec"] == "ddtree" and m["budget"] == "auto"), None), "ddtree:auto",
         dict(color="tab:orange", ls=":")),
    ) if m is not None]
    if not trees and not lines:
        return None
    plt = _pyplot()
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    for ax, key, label in ((ax1, "speedup_vs_none", "speedup over none (tokens/s)"),
                           (ax2, "mean_acceptance_length", "mean acceptance length (tokens/round)")):
        xs = [m["budget"] for m in trees if m[key] is not None]
        levels = [(m[key], name, style) for m, name, style in lines if m[key] is not None]
        if not xs and not levels:
            ax.text(0.5, 0.5, "no `none` run to compare with" if key == "speedup_vs_none" else "no data",
                    ha="center", va="center", transform=ax.transAxes)
            continue
        if xs:
            ax.plot(xs, [m[key] for m in trees if m[key] is not None], "o-", label="ddtree")
        for value, name, style in levels:
            ax.axhline(value, label=name, **style)
        if key == "speedup_vs_none":
            ax.axhline(1.0, color="black", lw=0.8, label="none")
        if xs:
            ax.set_xscale("log", base=2)
            ax.set_xticks(xs, [str(x) for x in xs])  # the budgets run, as numbers rather than powers of two
            ax.minorticks_off()
            ax.set_xlabel("tree budget (draft nodes per round)")
        else:  # nothing on the x axis but level lines: no budget scale to read
            ax.set_xticks([])
            ax.set_xlabel("tree budget (no fixed budget in this run)")
        ax.set_ylabel(label)
        ax.legend()
    fig.suptitle(f"{result['dataset']}: DDTree budget sweep ({_title(result)})")
    return _save(fig, path)


def _acceptance_hist(result: dict, path: Path) -> Path | None:
    spec = [m for m in result["methods"] if m["spec"] != "none"]
    if not spec:
        return None
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4))
    top = max((a for m in spec for p in m["per_prompt"] for a in p["acceptance_lengths"]), default=1)
    width = 0.8 / len(spec)
    for i, m in enumerate(spec):  # acceptance lengths are integers: grouped bars, one group per length
        values = [a for p in m["per_prompt"] for a in p["acceptance_lengths"]]
        if values:
            lengths = range(1, top + 1)
            ax.bar([n - 0.4 + width * (i + 0.5) for n in lengths], [values.count(n) / len(values) for n in lengths],
                   width=width, label=f"{m['method']} (mean {m['mean_acceptance_length']:.2f})")
    ax.set_xticks(range(1, top + 1))
    ax.set_xlabel("tokens emitted per round (acceptance length)")
    ax.set_ylabel("fraction of rounds")
    ax.legend()
    ax.set_title(f"acceptance lengths ({_title(result)})")
    return _save(fig, path)


def _stage_split(bars: list[tuple[str, dict]], path: Path, title: str) -> Path | None:
    bars = [(label, stages) for label, stages in bars if stages]
    if not bars:
        return None
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 0.5 * len(bars) + 1.5))
    left = [0.0] * len(bars)
    for stage in STAGES:
        widths = [stages.get(stage, 0.0) for _, stages in bars]
        ax.barh([label for label, _ in bars], widths, left=left, color=_COLORS[stage], label=stage)
        left = [a + b for a, b in zip(left, widths)]
    ax.invert_yaxis()
    ax.set_xlabel("ms per round")
    # Below the axes, where it covers no bar however long the rounds are.
    ax.legend(ncol=len(STAGES), fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.22 - 0.3 / len(bars)))
    ax.set_title(title)
    return _save(fig, path)


def _baselines(result: dict, path: Path) -> Path:
    plt = _pyplot()
    rows = result["baselines"]
    fig, ax = plt.subplots(figsize=(7, 4))
    xs = range(len(rows))
    ax.bar([x - 0.2 for x in xs], [r["tokens_per_second"] for r in rows], width=0.4, label="reference")
    ax.bar([x + 0.2 for x in xs], [r["ours_tokens_per_second"] or 0.0 for r in rows], width=0.4, label="treeflash")
    ax.set_xticks(list(xs), [f"{r['name']}\nvs {r['ours']}" for r in rows])
    ax.set_ylabel("tokens/s (batch size 1)")
    ax.legend()
    ax.set_title(f"side by side, same weights and prompts ({_title(result)})")
    return _save(fig, path)


# --- synthetic ---------------------------------------------------------------------------------------
def plot_synthetic(result: dict, out_dir: str | Path) -> list[Path]:
    """The first kernel variant's rows (the others are compared in the table)."""
    out_dir = Path(out_dir)
    rows = result["rows"]
    first = rows[0].get("variant") if rows else None
    result = {**result, "rows": [r for r in rows if r.get("variant") == first]}
    paths = [_synthetic_rounds(result, out_dir / f"synthetic_{result['shape']}_rounds.png")]
    first = min((r["batch"] for r in result["rows"]), default=None)
    if first is not None:
        paths.append(_stage_split([(r["method"], r["stage_ms"]) for r in result["rows"] if r["batch"] == first],
                                  out_dir / f"synthetic_{result['shape']}_stages.png",
                                  f"{result['shape']}, batch {first}: ms per round by stage ({_title(result)})"))
    return [p for p in paths if p is not None]


def _synthetic_rounds(result: dict, path: Path) -> Path | None:
    # The engine's default rounds only: /ngram rows verify more nodes than their budget, /sync ones run
    # another loop; neither belongs on these lines (the table and the JSON hold them).
    rows = [r for r in result["rows"] if not r.get("ngram_tokens") and not r.get("sync")]
    if not rows:
        return None
    plt = _pyplot()
    from matplotlib.ticker import FuncFormatter

    fig, ax = plt.subplots(figsize=(8, 5))
    for i, batch in enumerate(sorted({r["batch"] for r in rows})):
        color = f"C{i % 10}"
        trees = sorted((r for r in rows if r["batch"] == batch and r["spec"] == "ddtree" and isinstance(r["budget"], int)),
                       key=lambda r: r["budget"])
        if trees:
            ax.plot([r["budget"] for r in trees], [r["round_ms"] for r in trees], "o-", color=color,
                    label=f"ddtree, batch {batch}")
        for r in rows:
            if r["batch"] == batch and r["spec"] == "none":
                ax.axhline(r["round_ms"], color=color, ls="--", lw=1, label=f"AR step, batch {batch}")
            if r["batch"] == batch and r["spec"] == "dflash":
                ax.plot([r["nodes"] - 1], [r["round_ms"]], "s", color=color, label=f"dflash chain, batch {batch}")
    ax.axhline(result["floor_ms"], color="black", lw=1.5, label="weight-read floor")
    xs = sorted({r["budget"] for r in rows if r["spec"] == "ddtree" and isinstance(r["budget"], int)}
                | {r["nodes"] - 1 for r in rows if r["spec"] == "dflash"})
    if xs:
        ax.set_xscale("log", base=2)
        ax.set_xticks(xs, [str(x) for x in xs])  # the budgets run (and the chain's length), as numbers
    ax.set_yscale("log")
    # Milliseconds as plain numbers, with 2, 3 and 5 (20, 30, 50, ...) labelled between the decades.
    ax.yaxis.set_major_formatter(FuncFormatter(lambda y, _: f"{y:g}"))
    ax.yaxis.set_minor_formatter(FuncFormatter(lambda y, _: f"{y:g}" if f"{y:.1g}"[0] in "235" else ""))
    ax.set_xlabel("tree budget (draft nodes per round)")
    ax.set_ylabel("ms per round")
    ax.legend(fontsize=7, ncol=2)
    ax.set_title(f"{result['shape']} (random weights, context {result['config']['context']}), {_title(result)}")
    return _save(fig, path)
