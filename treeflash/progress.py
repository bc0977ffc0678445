"""The progress bar of `LLM.generate`: requests finished, with generated tokens and tokens/s beside them.

Counting requests alone says nothing during one long request, so the bar's postfix also counts every
token the engine emits and the rate since the run started.
"""

from __future__ import annotations

import time
from typing import Iterable

REDRAW_SECONDS = 0.2  # a round can take milliseconds; redrawing the terminal every round would cost more


class Progress:
    """A tqdm bar over `total` requests (nothing when disabled or not writing to a terminal)."""

    def __init__(self, total: int, enabled: bool):
        self.bar = None
        if enabled:
            from tqdm import tqdm

            self.bar = tqdm(total=total, desc="generating", unit="req", disable=None)  # off when not a terminal
        self.tokens = 0
        self.start = self.drawn = time.perf_counter()

    def __enter__(self) -> "Progress":
        return self

    def __exit__(self, *exc) -> None:
        if self.bar is not None:
            self._draw(0)
            self.bar.close()

    def update(self, updates: Iterable) -> None:
        """Count one engine step's updates (each has `request.finished` and `new_token_ids`)."""
        if self.bar is None:
            return
        finished = 0
        for u in updates:
            self.tokens += len(u.new_token_ids)
            finished += u.request.finished
        if finished or time.perf_counter() - self.drawn >= REDRAW_SECONDS:
            self._draw(finished)

    def _draw(self, finished: int) -> None:
        self.drawn = time.perf_counter()
        elapsed = self.drawn - self.start
        rate = self.tokens / elapsed if elapsed > 0 else 0.0
        self.bar.set_postfix_str(f"{self.tokens} tokens, {rate:.1f} tokens/s", refresh=False)
        self.bar.update(finished)
        self.bar.refresh()
