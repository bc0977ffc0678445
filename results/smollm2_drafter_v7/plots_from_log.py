"""Draw loss.png and acceptance.png of the seventh run from its train.log.

The run's second call hit its time limit before the final evaluation, so train-drafter never wrote
history.json or its plots; train.log holds every logged step and evaluation of both calls (steps the
second call repeated after resuming from the last checkpoint appear twice: the later line wins).
Usage: python results/smollm2_drafter_v7/plots_from_log.py
"""
import re
from pathlib import Path

from treeflash.train.plots import plot_history

here = Path(__file__).parent
train, evals = {}, {}
for line in (here / "train.log").read_text().splitlines():
    if m := re.search(r"step (\d+)/\d+ loss ([\d.]+) chain ([\d.]+) acc@1 ([\d.]+) lr ([\d.e+-]+) \|g\| ([\d.]+)", line):
        step = int(m[1])
        train[step] = {"step": step, "loss": float(m[2]), "chain": float(m[3]), "acc1": float(m[4]),
                       "lr": float(m[5]), "grad_norm": float(m[6])}
    elif m := re.search(r"eval step (\d+), (.*) \(", line):
        evals[int(m[1])] = {"step": int(m[1]), **{k: float(v) for k, v in
                                                   (kv.split(" ") for kv in m[2].split(", "))}}
history = {"train": [train[s] for s in sorted(train)], "eval": [evals[s] for s in sorted(evals)]}
print(*plot_history(history, here), sep="\n")
