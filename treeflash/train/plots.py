"""Loss and held-out acceptance curves as PNG files (matplotlib, no display needed)."""

from __future__ import annotations

from pathlib import Path


def plot_history(history: dict, out_dir: str | Path) -> list[Path]:
    """history: {"train": [{step, loss, lr, ...}], "eval": [{step, "dflash@T0": tau, ...}]} -> PNG paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir = Path(out_dir)
    written = []
    train = history.get("train") or []
    if train:
        fig, ax = plt.subplots(figsize=(7, 4))
        # Each record's loss is the mean over the steps since the one before (`steps`; older histories logged
        # one step's loss, and say nothing of the window).
        windows = {r["steps"] for r in train if "steps" in r}
        if not windows:
            mean = "one step every logging interval"
        elif len(windows) == 1:
            mean = f"mean over each {windows.pop()} steps"
        else:
            mean = "mean over each logging window"
        ax.plot([r["step"] for r in train], [r["loss"] for r in train], lw=1, label=f"weighted CE ({mean})")
        ax.set_xlabel("step")
        ax.set_ylabel("loss")
        ax.grid(alpha=0.3)
        twin = ax.twinx()
        twin.plot([r["step"] for r in train], [r["lr"] for r in train], color="gray", lw=0.8, ls="--",
                  label="learning rate")
        twin.set_ylabel("learning rate")
        twin.ticklabel_format(axis="y", style="sci", scilimits=(0, 0))
        ax.set_title("drafter training loss")
        # One legend for both axes, below them, where it covers neither curve nor tick labels.
        handles = ax.get_legend_handles_labels()[0] + twin.get_legend_handles_labels()[0]
        ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.18), ncol=2, fontsize=8)
        fig.tight_layout()
        written.append(out_dir / "loss.png")
        fig.savefig(written[-1], dpi=110, bbox_inches="tight")
        plt.close(fig)
    evals = history.get("eval") or []
    if evals:
        fig, ax = plt.subplots(figsize=(7, 4))
        keys = sorted({k for r in evals for k in r if "@" in k})
        for key in keys:
            points = [(r["step"], r[key]) for r in evals if key in r]
            ax.plot(*zip(*points), marker="o", label=key)
        ax.set_xlabel("step")
        ax.set_ylabel("acceptance length (tokens / round)")
        ax.set_title("held-out acceptance through the engine")
        ax.grid(alpha=0.3)
        ax.legend()
        fig.tight_layout()
        written.append(out_dir / "acceptance.png")
        fig.savefig(written[-1], dpi=110, bbox_inches="tight")
        plt.close(fig)
    return written
