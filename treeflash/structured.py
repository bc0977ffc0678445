"""Structured outputs (vLLM's): a reply held to a JSON schema, a regular expression or a list of choices,
lossless under speculation.

A request's structure becomes a token automaton over the vocabulary (outlines-core compiles the regular
expression, a JSON schema's through its own translation, against the tokenizer's byte strings, in a worker
process that a time limit can stop: treeflash/grammar_worker.py): in each
state, the tokens that keep the text on its way to a match, and the state each one leads to; in a state
where the text is a whole match, the request's stop tokens too. A drawn token's distribution is the
target's with every other token at -inf, as plain decoding would mask it at that point of the text.

In a draft tree each node draws after its own drafted path, so each node is masked in the state that path
leads to (from the slot's state, one transition per depth); a drafted token the structure forbids gets no
probability at its parent and can never be accepted, so the tokens stay plain decoding's. After a round the
slot's state follows the emitted tokens.

On the device the automata of every slot's request share one table (`GrammarSlots`): per state a bit row
of its allowed tokens, and the transitions as sorted keys (state x V + token) with their next states, looked
up by binary search; state 0 allows every token and leads to itself (slots without a structure, and the
nodes below a forbidden token, whose masks never matter). The table's tensors keep their place as requests
come and go, so rounds and prefills holding a structured request replay CUDA graphs like any others
(scripts/gpu_check.py, section S, checks them against eager rounds). On CUDA a round's lookups and masks
run as a few Triton kernels (treeflash/structure_kernel.py), the torch ops here being their reference.
"""

from __future__ import annotations

import json
import time
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from treeflash.grammar_worker import Worker, table_arrays
from treeflash.logprobs import byte_decoder, piece_bytes
from treeflash.structure_store import MIN_SECONDS, StructureStore, vocabulary_key
from treeflash.transfer import to_device

COMPILE_TIMEOUT = 60.0  # seconds a structure may take to compile (json_object at Qwen's vocabulary: 12.6 s here)


@dataclass(frozen=True)
class StructuredOutputsParams:
    """What a reply must be (exactly one): vLLM's `StructuredOutputsParams` fields.

    json: a JSON schema (a dict, or its JSON text); regex: a regular expression the whole reply matches
    (Rust regex syntax, as outlines-core reads it); choice: one of these strings exactly; json_object: any
    JSON object (a schema of {"type": "object"}: nesting to a fixed depth, as outlines-core writes it).
    whitespace_pattern (with json or json_object): the regular expression of the whitespace allowed between
    JSON's tokens; default outlines-core's `[ ]?`, at most one space, so a model cannot fill its tokens
    with blanks (an unbounded pattern such as `[\n ]*` lets it).
    """

    json: dict | str | None = None
    regex: str | None = None
    choice: list[str] | None = None
    json_object: bool | None = None
    whitespace_pattern: str | None = None

    def __post_init__(self):
        given = [name for name in ("json", "regex", "choice", "json_object")
                 if getattr(self, name) not in (None, False)]
        if len(given) != 1:
            raise ValueError(f"structured_outputs needs exactly one of json, regex, choice, json_object; got "
                             f"{', '.join(given) or 'none'}")
        if self.json is not None:
            if isinstance(self.json, str):
                try:
                    schema = json.loads(self.json)
                except ValueError as e:
                    raise ValueError(f"structured_outputs.json is not JSON: {e}") from None
            else:
                schema = self.json
            if not isinstance(schema, (dict, bool)):
                raise ValueError(f"structured_outputs.json must be a JSON schema (an object), got {self.json!r}")
        if self.regex is not None and (not isinstance(self.regex, str) or not self.regex):
            raise ValueError(f"structured_outputs.regex must be a non-empty string, got {self.regex!r}")
        if self.choice is not None and (not isinstance(self.choice, (list, tuple)) or not self.choice or not all(
                isinstance(c, str) and c for c in self.choice)):
            raise ValueError(f"structured_outputs.choice must be a non-empty list of non-empty strings, got "
                             f"{self.choice!r}")
        if self.json_object not in (None, True, False):
            raise ValueError(f"structured_outputs.json_object must be a bool, got {self.json_object!r}")
        if self.whitespace_pattern is not None:
            if not isinstance(self.whitespace_pattern, str) or not self.whitespace_pattern:
                raise ValueError(f"structured_outputs.whitespace_pattern must be a non-empty string, got "
                                 f"{self.whitespace_pattern!r}")
            if self.json is None and not self.json_object:
                raise ValueError("structured_outputs.whitespace_pattern shapes a JSON reply: it needs json or "
                                 "json_object")

    def pattern(self) -> str:
        """The regular expression the reply must match."""
        from outlines_core.json_schema import build_regex_from_schema

        if self.regex is not None:
            return self.regex
        if self.choice is not None:
            return "(" + "|".join(_escape(c) for c in self.choice) + ")"
        schema = {"type": "object"} if self.json_object else self.json
        try:
            return build_regex_from_schema(schema if isinstance(schema, str) else json.dumps(schema),
                                           self.whitespace_pattern)
        except Exception as e:  # noqa: BLE001 (outlines-core's own errors name what it cannot translate)
            raise ValueError(f"structured_outputs.json: {e}") from None


def _escape(text: str) -> str:
    # Rust's regex syntax allows escaping any ASCII punctuation; letters, digits and the rest stay literal.
    return "".join("\\" + c if c.isascii() and not c.isalnum() and not c.isspace() else c for c in text)


@dataclass(frozen=True)
class Grammar:
    """A token automaton over a vocabulary of V tokens, states 0..S-1 from `initial`: `allowed` [S, ceil(V/8)]
    uint8, bit t % 8 of byte t // 8 set where token t may come next; `keys` int64 sorted (state x V + token)
    and `next` int64, each allowed transition (stop tokens at a whole match lead back to their state)."""

    vocab_size: int
    initial: int
    allowed: np.ndarray
    keys: np.ndarray
    next: np.ndarray

    @property
    def num_states(self) -> int:
        return self.allowed.shape[0]

    @staticmethod
    def from_table(vocab_size: int, initial: int, table: dict[int, dict[int, int]]) -> "Grammar":
        """The automaton of states 0..S-1 with transitions table[state] = {token: next state}."""
        return Grammar(vocab_size, initial, *table_arrays(vocab_size, table))


class GrammarCompiler:
    """Compiles structures for one tokenizer (its vocabulary read once) and keeps the last `cache_size`
    automata: a JSON-object structure takes seconds to compile, and requests repeat their schemas. Compiles
    run in a worker process (treeflash/grammar_worker.py) and fail with a ValueError past `timeout` seconds
    (None: no limit); failures are kept like automata, so a repeated bad pattern fails at once. store: a
    folder where slow compiles are kept for later processes (treeflash/structure_store.py); None: none."""

    def __init__(self, tokenizer, vocab_size: int, cache_size: int = 32, timeout: float | None = COMPILE_TIMEOUT,
                 store: Path | None = None):
        self.vocab_size, self.timeout = vocab_size, timeout
        special = set(tokenizer.all_special_ids)
        eos = min(special) if special else vocab_size  # a stand-in end token: its transitions are dropped
        pieces: dict[bytes, list[int]] = {}
        decoder = byte_decoder()
        for token in range(min(len(tokenizer), vocab_size)):
            if token not in special:
                pieces.setdefault(_token_bytes(tokenizer, token, decoder), []).append(token)
        pieces.pop(b"", None)  # (a token of no text could follow itself forever)
        self._worker = Worker(eos, pieces, vocab_size)
        self._cache: OrderedDict[tuple, Grammar | ValueError] = OrderedDict()
        self.cache_size = cache_size
        self._store = None if store is None else StructureStore(store, vocabulary_key(self._worker.setup), vocab_size)

    def compile(self, params: StructuredOutputsParams, stop_ids: frozenset[int]) -> Grammar:
        pattern = params.pattern()
        key = (pattern, tuple(sorted(stop_ids)))
        if key not in self._cache:
            try:
                self._cache[key] = Grammar(self.vocab_size, *self._compiled(pattern, sorted(stop_ids)))
            except ValueError as e:  # (kept too: a pattern past the time limit must not cost it again)
                self._cache[key] = e
            if len(self._cache) > self.cache_size:
                self._cache.popitem(last=False)
        self._cache.move_to_end(key)
        found = self._cache[key]
        if isinstance(found, ValueError):
            raise ValueError(*found.args)
        return found

    def _compiled(self, pattern: str, stop_ids: list[int]):
        """The automaton's arrays: from the store where it has them, else compiled (and stored if that was slow)."""
        found = self._store.load(pattern, stop_ids) if self._store is not None else None
        if found is not None:
            return found
        start = time.monotonic()
        arrays = self._worker.compile(pattern, stop_ids, self.timeout)
        if self._store is not None and time.monotonic() - start >= MIN_SECONDS:
            self._store.save(pattern, stop_ids, arrays)
        return arrays

    def close(self) -> None:
        """End the worker process (a later compile starts another)."""
        self._worker.close()


def _pow2(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


def _token_bytes(tokenizer, token: int, decoder: dict[str, int]) -> bytes:
    """The bytes a token adds to the text: byte-level BPE's characters mapped back to bytes (`decoder`),
    SentencePiece's '▁' as a space and <0xNN> as that byte, else the token's decoded text."""
    piece = tokenizer.convert_ids_to_tokens(token)
    own = piece_bytes(piece, decoder)
    if own is not None:
        return own
    if isinstance(piece, str) and "▁" in piece:
        return piece.replace("▁", " ").encode("utf-8")
    return tokenizer.decode([token]).encode("utf-8")


class GrammarSlots:
    """The automata of the requests in the slots, in one table on the device, and each slot's state (a row of
    the table; 0: no structure).

    The table's tensors keep their place (a CUDA graph of a round reads them) and grow only by doubling,
    which bumps `generation` (graphs must then be captured again). Each distinct automaton is stored once,
    however many slots use it (a compiled structure is one object: the compiler caches it), so a request
    whose structure is already in the table costs no copy. A new automaton goes after the others, whose
    keys stay sorted; where no room is left, the running requests' automata are packed from row 1 again
    (the others', of finished requests, dropped) and the slots' states moved with their rows.

    kernels: whether `apply`, `apply_drafts` and `add` run as Triton kernels (treeflash/structure_kernel.py:
    a few launches a round instead of a dozen per step) rather than torch ops; None: on CUDA."""

    MIN_ROWS, MIN_KEYS = 64, 1 << 12

    def __init__(self, slots: int, vocab_size: int, device, kernels: bool | None = None):
        self.vocab_size, self.device = vocab_size, torch.device(device)
        self.kernels = self.device.type == "cuda" if kernels is None else kernels
        self.grammars: list[Grammar | None] = [None] * slots
        self.placed: dict[int, tuple[Grammar, int]] = {}  # id(grammar) -> (grammar, its first row)
        self.rows_used, self.keys_used, self.generation = 1, 0, 0
        self.state = torch.zeros(slots, dtype=torch.long, device=device)
        self.initial = torch.zeros(slots, dtype=torch.long, device=device)  # each slot's request's first state
        self._byte = torch.arange(vocab_size, device=device) // 8
        self._bit = (torch.arange(vocab_size, device=device) % 8).to(torch.uint8)
        self._allocate(self.MIN_ROWS, self.MIN_KEYS)

    def _allocate(self, rows: int, keys: int) -> None:
        """Empty tables of `rows` states and `keys` transitions (row 0: every token allowed; after the
        last key a sentinel that no query equals)."""
        self.allowed = torch.zeros((rows, (self.vocab_size + 7) // 8), dtype=torch.uint8, device=self.device)
        self.allowed[0] = 255
        self.keys = torch.full((keys + 1,), torch.iinfo(torch.long).max, dtype=torch.long, device=self.device)
        self.next = torch.zeros(keys + 1, dtype=torch.long, device=self.device)
        self.placed, self.rows_used, self.keys_used = {}, 1, 0
        self.generation += 1

    def start(self, slots: list[int], grammars: list[Grammar | None]) -> None:
        """New requests in `slots` with their automata (None: no structure, or a freed slot), in their
        initial states."""
        if all(g is None for g in grammars) and all(self.grammars[s] is None for s in slots):
            return  # (slots without a structure, before and after: nothing to do)
        for slot, grammar in zip(slots, grammars):
            self.grammars[slot] = grammar
        new = list({id(g): g for g in grammars if g is not None and id(g) not in self.placed}.values())
        if new and (self.rows_used + sum(g.num_states for g in new) > self.allowed.shape[0]
                    or self.keys_used + sum(g.keys.size for g in new) > self.keys.numel() - 1):
            self._repack()
        for grammar in new:
            if id(grammar) not in self.placed:
                self._place(grammar)
        initial = to_device([self.placed[id(g)][1] + g.initial if g is not None else 0 for g in grammars],
                            self.device, torch.long)
        slots = to_device(slots, self.device, torch.long)
        self.state[slots] = initial
        self.initial[slots] = initial

    def _place(self, grammar: Grammar) -> None:
        row, key, v = self.rows_used, self.keys_used, self.vocab_size
        self.allowed[row:row + grammar.num_states] = to_device(torch.from_numpy(grammar.allowed), self.device)
        self.keys[key:key + grammar.keys.size] = to_device(torch.from_numpy(grammar.keys + row * v), self.device)
        self.next[key:key + grammar.next.size] = to_device(torch.from_numpy(grammar.next + row), self.device)
        self.placed[id(grammar)] = (grammar, row)
        self.rows_used, self.keys_used = row + grammar.num_states, key + grammar.keys.size

    def _repack(self) -> None:
        """The running requests' automata from row 1 again (in larger tables where they need them), every
        slot's state moved with its automaton's rows."""
        live = list({id(g): g for g in self.grammars if g is not None}.values())
        old = {id(g): row for g, row in self.placed.values()}
        rows = 1 + sum(g.num_states for g in live)
        keys = sum(g.keys.size for g in live)
        if rows > self.allowed.shape[0] or keys > self.keys.numel() - 1:
            self._allocate(max(self.allowed.shape[0], _pow2(rows)), max(self.keys.numel() - 1, _pow2(keys)))
        else:
            self.keys.fill_(torch.iinfo(torch.long).max)
            self.placed, self.rows_used, self.keys_used = {}, 1, 0
        for grammar in live:
            self._place(grammar)
        moved = torch.tensor([self.placed[id(g)][1] - old[id(g)] if g is not None and id(g) in old else 0
                              for g in self.grammars], dtype=torch.long)
        moved = to_device(moved, self.device)
        self.state.add_(moved * (self.state > 0))
        self.initial.add_(moved * (self.initial > 0))

    def step(self, state: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """The states `tokens` lead to from `state` (same shapes); 0 where the token is not allowed (a
        forbidden draft's subtree: never accepted) and from state 0."""
        query = state * self.vocab_size + tokens
        at = torch.searchsorted(self.keys, query.flatten()).view(query.shape).clamp(max=self.keys.numel() - 1)
        return torch.where(self.keys[at] == query, self.next[at], torch.zeros_like(at))

    def first(self, slots: torch.Tensor, done: torch.Tensor, tokens: torch.Tensor) -> None:
        """Prefill drew each finished prompt's first token: its slot's state is the one that token leads to
        from the initial state (set, not stepped from the current one: a prefill graph's warm-up runs this
        too, as it runs the first token's mask, `apply` without a tree)."""
        initial = self.initial[slots]
        self.state[slots] = torch.where(done, self.step(initial, tokens), initial)

    def add(self, emitted: torch.Tensor, accepted: torch.Tensor) -> None:
        """A round emitted emitted[s, :accepted[s]] for slots [0, S): each slot's state follows them."""
        s = emitted.shape[0]
        if self.kernels:
            from treeflash.structure_kernel import follow  # (Triton: imported where it runs)

            follow(self.state, emitted, accepted, self.keys, self.next, self.vocab_size)
            return
        state = self.state[:s]
        for k in range(emitted.shape[1]):
            state = torch.where(k < accepted, self.step(state, emitted[:, k]), state)
        self.state[:s] = state

    def allowed_rows(self, state: torch.Tensor) -> torch.Tensor:
        """[..., V] uint8, 1 where `state` (any shape) allows the token."""
        return (self.allowed[state].index_select(-1, self._byte) >> self._bit) & 1

    def apply_drafts(self, logits: torch.Tensor, rows: slice, columns: torch.Tensor | None = None) -> torch.Tensor:
        """The drafter's logits [S, D, V'] (columns: the draft vocabulary's tokens, or None for all), each depth
        masked in the state the depths above lead to along their most likely allowed draft: exact for the
        depth-1 drafts and that chain, a guess for the other branches (drafts only; the target derives every
        token). A depth whose allowed tokens all lie outside the draft vocabulary keeps the drafter's own."""
        state = self.state[rows]
        if self.kernels:
            from treeflash.structure_kernel import drafts_masked

            return drafts_masked(logits, state, self.allowed, self.keys, self.next, self.vocab_size, columns)
        out = []
        for d in range(logits.shape[1]):
            allowed = self.allowed_rows(state)
            if columns is not None:
                allowed = allowed[:, columns]
            masked = logits[:, d].float().masked_fill(allowed == 0, float("-inf"))
            masked = torch.where(torch.isfinite(masked).any(-1, keepdim=True), masked, logits[:, d].float())
            out.append(masked)
            best = masked.argmax(-1)
            state = self.step(state, best if columns is None else columns[best])
        return torch.stack(out, 1)

    def apply(self, logits: torch.Tensor, rows: torch.Tensor | slice, tree=None, prefill: bool = False
              ) -> torch.Tensor:
        """logits [S, N, V] of slots `rows`: each node's tokens its path's state forbids at -inf. tree: the
        round's (each node in the state its drafted path leads to); None: every node in the slot's state.
        prefill: the first token's draw, in the request's initial state (a prefill graph's warm-up runs the
        prefill more than once, `first` too)."""
        root = (self.initial if prefill else self.state)[rows][:, None]
        s, n = logits.shape[:2]
        state = root.expand(s, n)
        paths = tree is not None and tree.size > 1 and tree.max_depth > 0
        if self.kernels:
            from treeflash.structure_kernel import masked_logits, tree_states

            if paths:
                state = tree_states(root[:, 0], tree, self.keys, self.next, self.vocab_size)
            return masked_logits(logits, state, self.allowed)
        if paths:
            for _ in range(tree.max_depth):  # (parents precede children: depth d is right after d passes)
                state = torch.where(tree.depths == 0, root, self.step(state.gather(1, tree.parents), tree.tokens))
        return logits.float().masked_fill(self.allowed_rows(state) == 0, float("-inf"))
