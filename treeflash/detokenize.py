"""Incremental detokenisation: the text of a growing token sequence without re-decoding all of it.

Each new token (or a round's tokens together, `push_many`) costs two decodes of a short window of
trailing tokens (the vLLM scheme of a prefix offset and a read offset): the window's text minus the
text of its already-read part is the new text. The window starts one step back so that tokenizers
whose decoding of a token depends on its left neighbour (a leading space, a merged byte sequence) see
that neighbour. Text that ends in an incomplete UTF-8 character (decoded as U+FFFD) is held back until a
later token completes it; where a model keeps ending on one (a loop of lone lead bytes, say), the text
before the last few tokens is let out after `HOLD_LIMIT` of them, since only a character in those can
still change: so the window, and each token's decoding, stays short.
"""

from __future__ import annotations

REPLACEMENT = "\ufffd"  # what a byte-level tokenizer decodes an incomplete UTF-8 sequence to
# Tokens held back before the text up to the last TAIL of them is let out. An incomplete character is at
# most 3 bytes of a 4-byte one, so it lies within the last 3 tokens (each token is at least one byte); the
# decoding of the bytes before it can no longer change. Without the limit a run of tokens that all end
# mid-character would be decoded again whole at every token: quadratic in the run's length.
HOLD_LIMIT, TAIL = 8, 4


class IncrementalDetokenizer:
    """The generated text of one request, grown token by token. `text` is final up to its end."""

    def __init__(self, tokenizer, skip_special_tokens: bool = True):
        self.tokenizer, self.skip_special_tokens = tokenizer, skip_special_tokens
        self.ids: list[int] = []
        self.text = ""
        self._prefix = 0  # the window starts here: earlier tokens are never decoded again
        self._read = 0  # tokens whose text is already in `self.text`
        self._peeked: tuple | None = None  # (token, position, what push would set) from `peek`

    def push(self, token: int) -> str:
        """Add one token; returns the text it completes ("" while a character is incomplete)."""
        if self._peeked is not None and self._peeked[:2] == (token, len(self.ids)):
            added, self._prefix, self._read = self._peeked[2:]
            self.ids.append(token)
        else:
            self.ids.append(token)
            added, self._prefix, self._read = self._next(final=False)
        self._peeked = None
        self.text += added
        return added

    def push_many(self, tokens: list[int]) -> str:
        """Add a round's tokens at once: two decodes for all of them instead of two each (a batch of
        requests pays this on the host between GPU rounds). The same text as pushing them one by one;
        where the last one leaves a character incomplete, they are pushed one by one, so the complete
        characters before it still come out now."""
        if len(tokens) == 1:
            return self.push(tokens[0])
        self.ids.extend(tokens)
        added, prefix, read = self._next(final=False)
        if read < len(self.ids):  # something held back: the complete characters before it come out
            del self.ids[len(self.ids) - len(tokens):]
            return "".join(self.push(token) for token in tokens)
        self._prefix, self._read, self._peeked = prefix, read, None
        self.text += added
        return added

    def peek(self, token: int) -> str:
        """The text `push(token)` would add, without adding it (the work is kept for that push)."""
        self.ids.append(token)
        try:
            step = self._next(final=False)
        finally:
            self.ids.pop()
        self._peeked = (token, len(self.ids), *step)
        return step[0]

    def peek_final(self, token: int) -> str:
        """The text `push(token)` then `flush()` would add: an incomplete last character as U+FFFD, as one
        decode of the whole sequence gives it (what a stop string is searched in, `Engine._stop_string_hit`)."""
        self.ids.append(token)
        try:
            return self._next(final=True)[0]
        finally:
            self.ids.pop()

    def flush(self) -> str:
        """The sequence is over: release what was held back for an incomplete character."""
        if self._read == len(self.ids):
            return ""
        added, self._prefix, self._read = self._next(final=True)
        self.text += added
        return added

    def cut(self, at: int) -> None:
        """Drop the text from character `at` on (a stop string ended the request there)."""
        self.text = self.text[:at]

    def _next(self, final: bool) -> tuple[str, int, int]:
        """(new text, new prefix offset, new read offset) for the tokens in `self.ids`."""
        window = self._decode(self.ids[self._prefix:])
        if window.endswith(REPLACEMENT) and not final:  # the last character is not complete yet: wait
            if len(self.ids) - self._read > HOLD_LIMIT:
                return self._release_before_tail(window)
            return "", self._prefix, self._read
        done = self._decode(self.ids[self._prefix:self._read])
        # NOTE: assumes decoding a window extends the decoding of its prefix, true of byte-level BPE,
        # SentencePiece and character vocabularies; a tokenizer that rewrites earlier text on decode
        # (space clean-up across the window edge) would shift the cut by that rewrite.
        return window[len(done):], self._read, len(self.ids)

    def _release_before_tail(self, window: str) -> tuple[str, int, int]:
        """The text up to the last TAIL tokens, when it is final: the window's decoding extends it by more
        than the incomplete last character (a character that straddles the cut is not final: wait)."""
        cut = len(self.ids) - TAIL
        done = self._decode(self.ids[self._prefix:self._read])
        before = self._decode(self.ids[self._prefix:cut])
        if len(window) > len(before) and window.startswith(before) and before.startswith(done):
            return before[len(done):], self._read, cut
        return "", self._prefix, self._read

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=self.skip_special_tokens) if ids else ""
