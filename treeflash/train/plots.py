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
        ax.plot([r["step"] for r in train], [r["loss"] for r in train], lw=1, label="weighted CE")
        ax.set_xlabel("step")
        ax.set_ylabel("loss")
        ax.set_yscale("log")
        ax.grid(alpha=0.3)
        twin = ax.twinx()
        twin.plot([r["step"] for r in train], [r["lr"] for r in train], color="gray", lw=0.8, ls="--", label="lr")
        twin.set_ylabel("learning rate")
        ax.set_title("drafter training loss")
        fig.legend(loc="upper right")
        fig.tight_layout()
        written.append(out_dir / "loss.png")
        fig.savefig(written[-1], dpi=110)
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
        fig.savefig(written[-1], dpi=110)
        plt.close(fig)
    return written
