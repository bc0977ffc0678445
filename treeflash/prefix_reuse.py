"""Which slots' caches still hold which prompts' prefilled chunks, so that a prompt beginning the same way
skips their prefill (vLLM's prefix caching, in the engine's per-slot caches).

A prompt is prefilled in chunks at fixed offsets (multiples of `prefill_chunk` from its start), and a
chunk's rows (the target's keys and values, the drafter's context, prompt lookup's tokens) depend only on
the tokens up to its end. So the rows of a whole chunk that an earlier prompt prefilled are the rows this
prompt's prefill would write there, bit for bit where prefill's numbers do not depend on the batch (the
CPU, float32: tests/test_prefix_reuse.py compares every token and log-prob with reuse off). Only whole
chunks count (a prompt's last, shorter piece is computed as a shorter forward), only prefilled rows (a
reply's rows come from verification, in another order of sums), and at least the prompt's last token is
always prefilled (its logits draw the first token).

A slot holds its chunks while it runs and after it is freed, until another request is given the slot
(or graphs are captured at start-up, which prefill idle slots from row 0). A round runs over every slot
below the highest running one, free ones included, and writes a slot's rows from its length on: a freed
slot's length is set to the rows it holds, so those rounds write past them (while they are no more rows
than the longest running request's: a round attends over them as over a request's, so a free slot
holding more there is emptied, `Engine._bound_free_prefixes`). A chunk held by another slot
is copied into the newcomer's slot (one device copy per cache) rather than taking a higher slot: rounds
cost by the highest slot they run over.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Held:
    tokens: list[int]  # the prompt whose first whole chunks the slot's rows hold
    # each held chunk's chained key: chunk k's stands for tokens[:(k + 1) * chunk]
    keys: list[int] = field(default_factory=list)

    @property
    def chunks(self) -> int:
        return len(self.keys)

    @property
    def last_key(self) -> int:
        """The last held chunk's key (0 before the first: the chain's start)."""
        return self.keys[-1] if self.keys else 0


class PrefixReuse:
    def __init__(self, slots: int, chunk: int):
        self.chunk = chunk
        self.held: list[Held | None] = [None] * slots
        self.holding: set[int] = set()  # the slots with a prompt (what a round's launch looks at)
        self._holders: dict[int, set[int]] = {}  # chunk key -> slots holding it

    def keys(self, tokens: list[int], chunks: int, start: int = 0, key: int = 0) -> list[int]:
        """The chained keys of chunks start..chunks-1 of `tokens` (`key`: chunk start - 1's, 0 before the first)."""
        out = []
        for k in range(start, chunks):
            key = hash((key, tuple(tokens[k * self.chunk:(k + 1) * self.chunk])))
            out.append(key)
        return out

    def find(self, prompt: list[int], prefer: int | None = None) -> tuple[int | None, int]:
        """A slot holding the longest run of this prompt's whole chunks that leaves its last token to
        prefill (`prefer` among those that do: no copy), and how many rows that is; (None, 0) where none
        does."""
        chunks = (len(prompt) - 1) // self.chunk
        keys = self.keys(prompt, chunks)
        for k in range(chunks, 0, -1):
            for slot in sorted(self._holders.get(keys[k - 1], ()), key=lambda i: (i != prefer, i)):
                rows = k * self.chunk
                if self.held[slot].tokens[:rows] == prompt[:rows]:  # (a hash match is checked, not trusted)
                    return slot, rows
        return None, 0

    def hold(self, slot: int, tokens: list[int], rows: int) -> None:
        """Slot `slot` now holds tokens[:rows] (whole chunks of it counted), whatever it held before."""
        self.forget([slot])
        self.held[slot] = Held(tokens)
        self.holding.add(slot)
        self.grow(slot, rows)

    def grow(self, slot: int, rows: int) -> None:
        """Slot `slot`'s prefill has reached `rows` rows of its prompt."""
        held = self.held[slot]
        if held is None:
            return
        for key in self.keys(held.tokens, rows // self.chunk, held.chunks, held.last_key):
            held.keys.append(key)
            self._holders.setdefault(key, set()).add(slot)

    def next_key(self, slot: int, end: int) -> int | None:
        """The key of slot `slot`'s prompt chunk ending at row `end`, where that is the next whole chunk its
        prefill writes and a longer prompt could take (its prompt goes on past it); else None."""
        held = self.held[slot]
        if held is None or end != (held.chunks + 1) * self.chunk or end >= len(held.tokens):
            return None
        return self.keys(held.tokens, held.chunks + 1, held.chunks, held.last_key)[0]

    def forget(self, slots) -> None:
        for slot in slots:
            held, self.held[slot] = self.held[slot], None
            self.holding.discard(slot)
            for key in held.keys if held is not None else ():
                holders = self._holders[key]
                holders.discard(slot)
                if not holders:
                    del self._holders[key]

    def forget_all(self) -> None:
        self.forget(range(len(self.held)))

    def rows(self, slot: int) -> int:
        """The rows slot `slot` holds (whole chunks; 0 for none)."""
        held = self.held[slot]
        return held.chunks * self.chunk if held is not None else 0

    def rows_held(self) -> int:
        """The most rows any slot holds."""
        return max(map(self.rows, range(len(self.held))), default=0)
