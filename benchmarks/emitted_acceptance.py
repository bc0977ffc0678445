"""Tokens per round as emitted, recomputed from stored `treeflash bench` results.

Until the engine counted what each round emitted, a request's last round counted every token it accepted,
including those a stop or max_tokens then cut, which raised the recorded mean. The results keep each
method's generated tokens and rounds, and a request's first token comes from prefill, so the emitted mean
is (generated tokens - prompts) / rounds. Prints both for every file given, and writes them as JSON:

    python benchmarks/emitted_acceptance.py --out benchmarks/emitted_acceptance.json \\
        benchmarks/h200-smollm2-drafter-v13/acc-*.json.gz ...
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
from pathlib import Path


def rows(path: Path) -> list[dict]:
    with (gzip.open if path.suffix == ".gz" else open)(path, "rt", encoding="utf-8") as f:
        result = json.load(f)
    prompts, out = result["num_prompts"], []
    for m in result.get("methods", []):
        if m.get("rounds"):
            out.append({"file": str(path), "dataset": result["dataset"], "temperature": result["config"]["temperature"],
                        "batch_size": result["config"].get("batch_size"), "method": m["method"],
                        "recorded": round(m["mean_acceptance_length"], 4),
                        "emitted": round((m["generated_tokens"] - prompts) / m["rounds"], 4)})
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("files", nargs="+", type=Path)
    p.add_argument("--out", type=Path)
    args = p.parse_args()
    table = [r for f in args.files for r in rows(f)]
    for r in table:
        print(f"{r['file']:70s} {r['method']:12s} T={r['temperature']:<4} recorded {r['recorded']:.3f} "
              f"emitted {r['emitted']:.3f} ({100 * (r['recorded'] / r['emitted'] - 1):+.1f}%)")
    if args.out:
        args.out.write_text(json.dumps({"command": "python " + " ".join(sys.argv), "rows": table}, indent=1) + "\n")


if __name__ == "__main__":
    main()
