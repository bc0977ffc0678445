"""Log-probabilities of generated tokens (vLLM's `SamplingParams.logprobs`, OpenAI's `logprobs`).

For each generated token a request asking for them gets its log-probability under the target's raw
next-token distribution (log_softmax of the logits, before temperature and the filters: vLLM's default
"raw" mode), its rank there (vLLM's rule: how many tokens are at least as likely, itself included) and
the `logprobs` most likely tokens with theirs. A round already has the target's logits at every tree
node, and the token emitted at depth d was derived from the accepted path's node at depth d: the
log-probs are those logits' own, with no pass of their own, whatever the method.

On the device they are packed into the round's int64 read-back (log-probs as float64 bit patterns,
`pack`), so asking for them adds no host synchronisation; `unpack` turns one token's columns back into
vLLM's {token id: Logprob} on the host.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import torch

# The most alternatives a request may ask for (vLLM's default max_logprobs; OpenAI's top_logprobs bound).
MAX_LOGPROBS = 20
# Columns per token: its log-prob, its rank, the MAX_LOGPROBS most likely ids, then their log-probs.
COLUMNS = 2 + 2 * MAX_LOGPROBS


@dataclass(frozen=True)
class Logprob:
    """One token's entry (vLLM's fields): log-probability, rank (1: the most likely) and its text."""

    logprob: float
    rank: int
    decoded_token: str | None = None


def pack(logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """logits [..., V], tokens [...] (the token drawn from each row) -> int64 [..., COLUMNS]: the token's
    log-prob, its rank and the top MAX_LOGPROBS (ids, then log-probs; a vocabulary smaller than that pads
    with id -1). Log-probs are float32 (logit - logsumexp) carried as float64 bits. Fixed shapes, no host
    read: capturable in a CUDA graph."""
    # On the logits themselves, less their log-sum-exp: no vocabulary-wide log_softmax is written, and ranks
    # compare the logits (which subtracting the same number could only tie, never reorder).
    x = logits.float()
    lse = torch.logsumexp(x, dim=-1, keepdim=True)
    picked = x.gather(-1, tokens[..., None].long())
    rank = (x >= picked).sum(-1, keepdim=True)
    k = min(MAX_LOGPROBS, x.shape[-1])
    top = x.topk(k, dim=-1)
    chosen, ids, values = picked - lse, top.indices, top.values - lse
    if k < MAX_LOGPROBS:
        pad = (*ids.shape[:-1], MAX_LOGPROBS - k)
        ids = torch.cat([ids, ids.new_full(pad, -1)], -1)
        values = torch.cat([values, values.new_full(pad, float("-inf"))], -1)
    bits = lambda x: x.double().view(torch.int64)  # noqa: E731 (same width: a view, exact)
    return torch.cat([bits(chosen), rank, ids, bits(values)], -1)


def emitted_logprobs(logits: torch.Tensor, path: torch.Tensor, emitted: torch.Tensor) -> torch.Tensor:
    """A round's packed log-probs [S, D+1, COLUMNS]: the token emitted at depth d (emitted[:, d]) under the
    logits of the accepted path's node at depth d (path[:, d]; logits [S, N, V] at every node). Entries past
    a slot's accepted count are those of the root's logits: the host never reads them."""
    rows = logits.gather(1, path[:, :, None].expand(-1, -1, logits.shape[-1]))
    return pack(rows, emitted)


def _float(bits: int) -> float:
    return struct.unpack("<d", struct.pack("<q", bits))[0]


def unpack(columns: list[int], token: int, top: int, decode=None) -> dict[int, Logprob]:
    """One token's packed columns -> {token id: Logprob}: the token first, then the `top` most likely
    (vLLM's layout: `top` entries, or top + 1 when the token is not among them). decode(id) -> its text."""
    text = decode or (lambda _: None)
    out = {token: Logprob(_float(columns[0]), columns[1], text(token))}
    ids, values = columns[2:2 + MAX_LOGPROBS], columns[2 + MAX_LOGPROBS:]
    for rank, (other, bits) in enumerate(zip(ids[:top], values[:top]), start=1):
        if other >= 0 and other not in out:
            out[other] = Logprob(_float(bits), rank, text(other))
    return out


def check_logprobs(value, name: str = "logprobs") -> int | None:
    """SamplingParams.logprobs / prompt_logprobs: None (none) or 0..MAX_LOGPROBS alternatives per token."""
    from treeflash.sampling import as_int

    if value is None:
        return None
    n = as_int(value)
    if n is None or not 0 <= n <= MAX_LOGPROBS:
        which = "generated" if name == "logprobs" else "prompt"
        raise ValueError(f"{name} must be None or an integer in [0, {MAX_LOGPROBS}] (the most likely tokens "
                         f"returned beside each {which} one), got {value!r}")
    return n


# --- token text and bytes, for the OpenAI formats ---------------------------------------------------------
def byte_decoder() -> dict[str, int]:
    """Byte-level BPE's character for each byte, inverted (GPT-2's printable mapping)."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) \
        + list(range(ord("®"), ord("ÿ") + 1))
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[chr(b)] = b
        else:
            chars[chr(256 + extra)] = b
            extra += 1
    return chars


def piece_bytes(piece, decoder: dict[str, int]) -> bytes | None:
    """A vocabulary piece's own bytes where the piece spells bytes: SentencePiece's <0xNN>, or byte-level BPE's
    characters (`decoder`, `byte_decoder()`); None for any other piece."""
    if not isinstance(piece, str) or not piece:
        return None
    if piece.startswith("<0x") and piece.endswith(">") and len(piece) == 6:
        try:
            return bytes([int(piece[3:5], 16)])
        except ValueError:
            pass
    if all(c in decoder for c in piece):
        return bytes(decoder[c] for c in piece)
    return None


class TokenPieces:
    """Each token's own text and bytes (memoised): what OpenAI's logprob entries show per token. Bytes are
    exact for byte-level BPE vocabularies (GPT-2, Llama 3, Qwen, SmolLM2), where a token may hold part of a
    character; elsewhere they are the UTF-8 of the token's decoded text."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self._text: dict[int, str] = {}
        self._bytes: dict[int, list[int]] = {}
        self._decoder = byte_decoder()

    def text(self, token: int) -> str:
        if token not in self._text:
            self._text[token] = self.tokenizer.decode([token], skip_special_tokens=False) \
                if self.tokenizer is not None else str(token)
        return self._text[token]

    def bytes(self, token: int) -> list[int]:
        if token not in self._bytes:
            self._bytes[token] = list(self._raw(token))
        return self._bytes[token]

    def _raw(self, token: int) -> bytes:
        if self.tokenizer is not None:
            own = piece_bytes(self.tokenizer.convert_ids_to_tokens(token), self._decoder)
            if own is not None:
                return own
        return self.text(token).encode("utf-8")
