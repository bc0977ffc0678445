"""Compiled structures kept on disk, so that a process started again does not compile them again.

A process's first `json_object` request waited 7.5 s for its automaton at SmolLM2's vocabulary and 17.6 s at
Qwen2.5-Coder's (this 2-core CPU), after every start of a server; with the automaton stored here, 0.41 and
1.3 s (reading the vocabulary, mostly: benchmarks/cpu-structure-store/). A file is a
compressed numpy archive, read without pickle (nothing in it can run), named by a hash of everything the
automaton depends on: the pattern, the stop tokens, the vocabulary's byte strings, outlines-core's version
and the source of the code that builds the arrays (treeflash/grammar_worker.py), so a change to any of them
misses rather than reads a stale automaton. Only compiles of a second or more are kept (a small schema
compiles in a tenth of that), and the folder is held under `max_bytes` by dropping the files read least
recently. A folder that cannot be written costs nothing but the saving.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import warnings
import zipfile
from importlib import metadata
from pathlib import Path

import numpy as np

from treeflash import grammar_worker

MIN_SECONDS = 1.0  # compiles at least this long are kept
MAX_BYTES = 1 << 30  # the folder's size, at most (json_object at Qwen's vocabulary: ~15 MB a file)

Arrays = tuple[int, np.ndarray, np.ndarray, np.ndarray]  # (initial state, allowed, keys, next), as Grammar's


def vocabulary_key(setup: bytes) -> str:
    """A hash of what every automaton over a vocabulary depends on besides its pattern (`setup`: the vocabulary
    as the compile worker is given it, `grammar_worker.Worker.setup`)."""
    digest = hashlib.sha256(metadata.version("outlines_core").encode() + b"\0")
    digest.update(Path(grammar_worker.__file__).read_bytes() + b"\0")
    digest.update(setup)
    return digest.hexdigest()


class StructureStore:
    def __init__(self, folder: Path, vocabulary: str, vocab_size: int, max_bytes: int = MAX_BYTES):
        self.folder, self.vocabulary, self.vocab_size, self.max_bytes = Path(folder), vocabulary, vocab_size, max_bytes
        self._warned = False

    def _path(self, pattern: str, stop_ids: list[int]) -> Path:
        name = hashlib.sha256(json.dumps([self.vocabulary, pattern, stop_ids]).encode()).hexdigest()
        return self.folder / f"{name}.npz"

    def load(self, pattern: str, stop_ids: list[int]) -> Arrays | None:
        """The stored automaton of `pattern`, or None (none stored, or a file that does not read as one)."""
        path = self._path(pattern, stop_ids)
        try:
            with np.load(path, allow_pickle=False) as stored:
                arrays = (int(stored["initial"]), stored["allowed"], stored["keys"], stored["next"])
            os.utime(path)  # (read recently: trimmed last)
        except (OSError, ValueError, KeyError, zipfile.BadZipFile, EOFError):
            return None
        _, allowed, keys, nexts = arrays
        states = allowed.shape[0] if allowed.ndim == 2 else 0
        if (allowed.dtype != np.uint8 or allowed.ndim != 2 or allowed.shape[1] != (self.vocab_size + 7) // 8
                or keys.shape != nexts.shape or not 0 <= arrays[0] < states):
            return None
        return arrays

    def save(self, pattern: str, stop_ids: list[int], arrays: Arrays) -> None:
        path = self._path(pattern, stop_ids)
        temporary = path.with_name(f"{path.stem}.{os.getpid()}.tmp")
        initial, allowed, keys, nexts = arrays
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            # np.savez_compressed's zlib level takes 6x as long for 4% less (1.5 s against 0.23 s for
            # json_object at SmolLM2's vocabulary, 5.6 MB): level 1, in the same .npz layout np.load reads.
            with zipfile.ZipFile(temporary, "w", zipfile.ZIP_DEFLATED, compresslevel=1) as archive:
                for name, array in (("initial", np.array(initial)), ("allowed", allowed), ("keys", keys),
                                    ("next", nexts)):
                    with archive.open(f"{name}.npy", "w", force_zip64=True) as file:
                        np.lib.format.write_array(file, array, allow_pickle=False)
            os.replace(temporary, path)  # (whole or not at all, for another process reading it)
            self._trim()
        except OSError as e:
            with contextlib.suppress(OSError):
                temporary.unlink(missing_ok=True)
            if not self._warned:
                self._warned = True
                warnings.warn(f"compiled structures are not kept in {self.folder} ({e}); each process compiles "
                              f"them again", stacklevel=2)

    def _trim(self) -> None:
        files = []
        for path in self.folder.glob("*.npz"):
            try:
                files.append((path.stat().st_mtime, path.stat().st_size, path))
            except OSError:  # (another process removed it)
                pass
        total = sum(size for _, size, _ in files)
        for _, size, path in sorted(files):
            if total <= self.max_bytes:
                break
            path.unlink(missing_ok=True)
            total -= size
