"""Which commit a benchmark ran: the commits whose treeflash/**/*.py give a result's `source_digest`.

  python scripts/which_commit.py DIGEST [--last 200]

A result JSON records `environment.git` from the checkout's .git, which a copied tree can have stale (the
lent GPU machine's copy) or not at all; `environment.source_digest` is computed from the sources that
ran, so walking the history for it names the code (several commits when only other files changed).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from treeflash.provenance import source_digest  # noqa: E402


def git(*args: str) -> bytes:
    return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, check=True).stdout


def digest_at(commit: str) -> str:
    paths = [p for p in git("ls-tree", "-r", "--name-only", commit, "treeflash/").decode().split("\n")
             if p.endswith(".py")]
    return source_digest({p: git("show", f"{commit}:{p}") for p in paths})


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("digest")
    ap.add_argument("--last", type=int, default=200, help="how many commits back to look (default 200)")
    args = ap.parse_args()
    found = [c for c in git("rev-list", f"--max-count={args.last}", "HEAD").decode().split()
             if digest_at(c) == args.digest]
    for commit in found:
        print(git("log", "-1", "--format=%h %ad %s", "--date=short", commit).decode().strip())
    if not found:
        print(f"no commit among the last {args.last} has source digest {args.digest}", file=sys.stderr)
    return 0 if found else 1


if __name__ == "__main__":
    sys.exit(main())
