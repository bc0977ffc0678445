"""Which code produced a result: the git commit of the checkout and a digest of the package's sources."""

from __future__ import annotations

import hashlib
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def git_commit() -> dict:
    """The commit of the treeflash checkout that ran, and whether it had uncommitted changes."""
    try:
        head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True,
                              timeout=10, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10, check=True).stdout.strip()
        return {"commit": head, "dirty": bool(dirty)}
    except (OSError, subprocess.SubprocessError):
        return {"commit": None, "dirty": None}  # not a git checkout (an installed wheel, a copied tree)


def source_digest(files: dict[str, bytes] | None = None) -> str:
    """sha256 (16 hex digits) of the package's Python sources, path and bytes in path order.

    Names the code that ran even where `git_commit` cannot: a copied tree whose .git is stale (the lent
    GPU machine's copy kept its first commit) or none. `scripts/which_commit.py DIGEST` finds the commit.
    files: {path relative to the repository: bytes} (default: this checkout's treeflash/**/*.py)."""
    if files is None:
        files = {p.relative_to(ROOT).as_posix(): p.read_bytes() for p in (ROOT / "treeflash").rglob("*.py")}
    digest = hashlib.sha256()
    for path in sorted(files):
        digest.update(path.encode() + b"\0" + files[path] + b"\0")
    return digest.hexdigest()[:16]
