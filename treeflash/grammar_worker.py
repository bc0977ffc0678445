"""Compiling structures in a process of its own, so that a time limit can stop a compile.

outlines-core's compile grows with the regular expression's automaton, and some short patterns blow it up
exponentially: `(a|b)*a(a|b){14}` takes 46 s on a 2-core CPU at SmolLM2's vocabulary, and each step up in the
count quadruples it (time and memory). A thread cannot be stopped; a process can. The worker reads the
vocabulary once, then compiles one pattern at a time into the arrays of a `Grammar`; past the time limit the
caller kills it, the request gets a clear error, and the next compile starts a fresh worker.

Only numpy and outlines-core are imported here (not torch), so a worker starts in well under a second. The
pipes carry JSON lines one way and .npy arrays (loaded without pickle) the other.
"""

from __future__ import annotations

import io
import json
import os
import select
import struct
import subprocess
import sys
import time

import numpy as np

MAX_STATES = 1 << 16  # states an automaton may have (json_object's, at 1,623, is the largest seen)


def table_arrays(vocab_size: int, table: dict[int, dict[int, int]]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(allowed bit rows, sorted keys, next states) of the automaton table[state] = {token: next state}."""
    rows = np.array([s for s, out in table.items() for _ in out], dtype=np.int64)
    tokens = np.array([t for out in table.values() for t in out], dtype=np.int64)
    nexts = np.array([to for out in table.values() for to in out.values()], dtype=np.int64)
    keys = rows * vocab_size + tokens
    order = np.argsort(keys)
    bits = np.zeros((max(table) + 1, vocab_size), dtype=bool)
    bits[rows, tokens] = True
    return np.packbits(bits, axis=1, bitorder="little"), keys[order], nexts[order]


def build(pattern: str, vocabulary, eos: int, stop_ids: list[int], vocab_size: int):
    """(initial state, allowed, keys, next) of `pattern`'s token automaton; ValueError where there is none."""
    from outlines_core import Index

    try:
        index = Index(pattern, vocabulary)
    except Exception as e:  # noqa: BLE001 (a pattern it cannot parse, or one no token sequence can spell)
        raise ValueError(f"structured outputs: cannot build an automaton for {pattern[:200]!r}: {e}") from None
    transitions = index.get_transitions()
    final = index.get_final_states()
    states = sorted(set(transitions) | set(final))
    if len(states) > MAX_STATES:
        raise ValueError(f"structured outputs: the automaton has {len(states)} states; at most {MAX_STATES}")
    number = {s: i for i, s in enumerate(states)}
    table = {number[s]: {t: number[to] for t, to in transitions.get(s, {}).items() if t != eos} for s in states}
    for state in final:  # (at a whole match, any stop token ends the reply)
        table[number[state]].update({t: number[state] for t in stop_ids if t < vocab_size})
    if any(not out for out in table.values()):
        raise ValueError(f"structured outputs: {pattern[:200]!r} reaches a state where no token may follow "
                         f"(and the text is no whole match a stop token could end)")
    return (number[index.get_initial_state()], *table_arrays(vocab_size, table))


class Worker:
    """A compile process over one vocabulary (`eos`: the stand-in end token; `pieces`: bytes -> token ids)."""

    def __init__(self, eos: int, pieces: dict[bytes, list[int]], vocab_size: int):
        self._setup = json.dumps({"eos": eos, "vocab_size": vocab_size,
                                  "pieces": [[p.hex(), ids] for p, ids in pieces.items()]}).encode() + b"\n"
        self._proc: subprocess.Popen | None = None

    def compile(self, pattern: str, stop_ids: list[int], timeout: float | None):
        """As `build`, in the worker; ValueError past `timeout` seconds (the worker is then killed)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        try:
            if self._proc is None or self._proc.poll() is not None:
                root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # (run from a checkout too)
                path = os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))
                self._proc = subprocess.Popen([sys.executable, "-m", "treeflash.grammar_worker"],
                                              stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                              env={**os.environ, "PYTHONPATH": path})
                self._proc.stdin.write(self._setup)
            self._proc.stdin.write(json.dumps({"pattern": pattern, "stop_ids": stop_ids}).encode() + b"\n")
            self._proc.stdin.flush()
            size, = struct.unpack("<Q", self._read(8, deadline))
            answer = self._read(size, deadline)
        except TimeoutError:
            self.close()
            raise ValueError(f"structured outputs: {pattern[:200]!r} did not compile within {timeout:g} s (its "
                             f"automaton grows too large; a simpler pattern or schema will do)") from None
        except (OSError, EOFError) as e:  # (it died: out of memory, say)
            self.close()
            raise ValueError(f"structured outputs: compiling {pattern[:200]!r} failed ({e or 'the worker ended'})"
                             ) from None
        if answer[:1] == b"E":
            raise ValueError(answer[1:].decode())
        arrays = np.load(io.BytesIO(answer), allow_pickle=False)
        return int(arrays["initial"]), arrays["allowed"], arrays["keys"], arrays["next"]

    def _read(self, n: int, deadline: float | None) -> bytes:
        fd, out = self._proc.stdout.fileno(), bytearray()
        while len(out) < n:
            wait = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not select.select([fd], [], [], wait)[0]:
                raise TimeoutError
            chunk = os.read(fd, min(n - len(out), 1 << 20))
            if not chunk:
                raise EOFError
            out += chunk
        return bytes(out)

    def close(self) -> None:
        if self._proc is not None:
            self._proc.kill()
            self._proc.wait()
            for pipe in (self._proc.stdin, self._proc.stdout):
                pipe.close()
            self._proc = None

    def __del__(self):
        try:
            self.close()
        except Exception:  # noqa: BLE001 (interpreter shutdown)
            pass


def _main() -> None:
    from outlines_core import Vocabulary

    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    setup = json.loads(stdin.readline())
    vocabulary = Vocabulary(setup["eos"], {bytes.fromhex(p): ids for p, ids in setup["pieces"]})
    for line in stdin:  # (ends when the caller closes the pipe or goes away)
        request = json.loads(line)
        try:
            initial, allowed, keys, nexts = build(request["pattern"], vocabulary, setup["eos"], request["stop_ids"],
                                                  setup["vocab_size"])
            buffer = io.BytesIO()
            np.savez(buffer, initial=np.array(initial), allowed=allowed, keys=keys, next=nexts)
            answer = buffer.getvalue()
        except ValueError as e:
            answer = b"E" + str(e).encode()
        stdout.write(struct.pack("<Q", len(answer)) + answer)
        stdout.flush()


if __name__ == "__main__":
    _main()
