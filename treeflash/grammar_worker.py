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
    states = max(table) + 1
    return _arrays(vocab_size, states, [(s, np.fromiter(out, np.int64, len(out)),
                                         np.fromiter(out.values(), np.int64, len(out))) for s, out in table.items()])


def _arrays(vocab_size: int, states: int, rows: list[tuple[int, np.ndarray, np.ndarray]]):
    """table_arrays from each state's (state, tokens, next states) arrays."""
    state = np.concatenate([np.full(len(t), s, np.int64) for s, t, _ in rows])
    tokens = np.concatenate([t for _, t, _ in rows])
    nexts = np.concatenate([n for _, _, n in rows])
    keys = state * vocab_size + tokens
    order = np.argsort(keys, kind="stable")
    bits = np.zeros((states, vocab_size), dtype=bool)
    bits[state, tokens] = True
    return np.packbits(bits, axis=1, bitorder="little"), keys[order], nexts[order]


def build(pattern: str, vocabulary, eos: int, stop_ids: list[int], vocab_size: int):
    """(initial state, allowed, keys, next) of `pattern`'s token automaton; ValueError where there is none."""
    from outlines_core import Index

    try:
        index = Index(pattern, vocabulary)
    except Exception as e:  # noqa: BLE001 (a pattern it cannot parse, or one no token sequence can spell)
        raise ValueError(f"structured outputs: cannot build an automaton for {pattern[:200]!r}: {e}") from None
    transitions = index.get_transitions()
    final = set(index.get_final_states())
    states = sorted(set(transitions) | final)
    if len(states) > MAX_STATES:
        raise ValueError(f"structured outputs: the automaton has {len(states)} states; at most {MAX_STATES}")
    # States renumbered 0..S-1 in order; arrays per state, not a dict per transition (json_object at a
    # 151,936-token vocabulary has 9.8 million of them).
    known = np.array(states, dtype=np.int64)
    stops = np.array(sorted({t for t in stop_ids if t < vocab_size}), dtype=np.int64)
    rows = []
    for number, state in enumerate(states):
        out = transitions.get(state, {})
        tokens = np.fromiter(out, np.int64, len(out))
        nexts = np.searchsorted(known, np.fromiter(out.values(), np.int64, len(out)))
        keep = tokens != eos
        tokens, nexts = tokens[keep], nexts[keep]
        if state in final:  # (at a whole match, any stop token ends the reply, and leads back here)
            tokens, nexts = np.concatenate([tokens, stops]), np.concatenate([nexts, np.full(len(stops), number)])
            tokens, first = np.unique(tokens[::-1], return_index=True)  # (the stop's transition replaces the pattern's)
            nexts = nexts[::-1][first]
        if not len(tokens):
            raise ValueError(f"structured outputs: {pattern[:200]!r} reaches a state where no token may follow "
                             f"(and the text is no whole match a stop token could end)")
        rows.append((number, tokens, nexts))
    return (states.index(index.get_initial_state()), *_arrays(vocab_size, len(states), rows))


class Worker:
    """A compile process over one vocabulary (`eos`: the stand-in end token; `pieces`: bytes -> token ids)."""

    def __init__(self, eos: int, pieces: dict[bytes, list[int]], vocab_size: int):
        # (the first line the worker reads: the vocabulary, all it depends on besides a pattern)
        self.setup = json.dumps({"eos": eos, "vocab_size": vocab_size,
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
                self._proc.stdin.write(self.setup)
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
