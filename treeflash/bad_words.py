"""bad_words (vLLM's): token sequences a request must not generate, lossless under speculation.

A bad word is a token sequence w (the word tokenised alone, and with a leading space where that gives as
many tokens and another first token: vLLM's rule, `bad_word_sequences`). Its last token gets no probability
wherever the tokens generated just before equal the rest of w: always for a one-token word, and for a longer
one only after its prefix, counted in the output alone (not the prompt), as vLLM counts it.

In a draft tree a node's past is the output so far plus the node's drafted path below the root (the root is
the last emitted token, already in the output): each node is masked with the last tokens of that past, so
the distribution a node derives from is the one plain decoding would mask at that position, and the tokens
stay plain decoding's. Per slot the device keeps its sequences, right-aligned in a fixed [MAX_SEQUENCES,
MAX_TOKENS] block (static shapes, for CUDA graphs), and its last MAX_TOKENS - 1 generated tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from treeflash.transfer import to_device
from treeflash.tree import DraftTree

MAX_SEQUENCES = 32  # token sequences a request's bad words may make (each word gives one or two)
MAX_TOKENS = 16  # tokens a sequence may have
_ANY = -1  # a prefix column before a shorter sequence's start: matches anything
_NONE = -2  # a past column before the output's first token: matches no token


def bad_word_sequences(words: list[str], tokenizer) -> list[list[int]]:
    """vLLM's token sequences of `words`: each word alone, and with a leading space where that tokenises to as
    many tokens with another first token (a word-initial form); duplicates once."""
    out: list[list[int]] = []
    for word in words:
        alone = list(tokenizer.encode(word, add_special_tokens=False))
        if not alone:
            raise ValueError(f"bad_words holds {word!r}, which tokenises to no token")
        candidates = [alone]
        if not word.startswith(" "):
            spaced = list(tokenizer.encode(" " + word, add_special_tokens=False))
            if len(spaced) == len(alone) and spaced[0] != alone[0]:
                candidates.append(spaced)
        out += [c for c in candidates if c not in out]
    too_long = [s for s in out if len(s) > MAX_TOKENS]
    if too_long:
        raise ValueError(f"bad_words may have at most {MAX_TOKENS} tokens a word; {len(too_long[0])} in "
                         f"{tokenizer.decode(too_long[0])!r}")
    if len(out) > MAX_SEQUENCES:
        raise ValueError(f"bad_words make {len(out)} token sequences (a word may make two: with and without a "
                         f"leading space); at most {MAX_SEQUENCES}")
    return out


@dataclass
class BadWords:
    """Per slot: its sequences' prefixes [slots, W, P] (right-aligned, _ANY before a shorter one's start; P =
    MAX_TOKENS - 1), their last tokens [slots, W], which of the W are in use, and the slot's last P generated
    tokens [slots, P] (the newest last; _NONE before the first)."""

    prefix: torch.Tensor  # int64
    last: torch.Tensor  # int64
    used: torch.Tensor  # bool
    past: torch.Tensor  # int64

    @staticmethod
    def new(slots: int, device) -> "BadWords":
        p = MAX_TOKENS - 1
        return BadWords(torch.full((slots, MAX_SEQUENCES, p), _ANY, dtype=torch.long, device=device),
                        torch.zeros(slots, MAX_SEQUENCES, dtype=torch.long, device=device),
                        torch.zeros(slots, MAX_SEQUENCES, dtype=torch.bool, device=device),
                        torch.full((slots, p), _NONE, dtype=torch.long, device=device))

    def start(self, slots: list[int], sequences: list[list[list[int]] | None]) -> None:
        """New requests in `slots` with their sequences (None: none) and nothing generated yet; queued through
        pinned memory, as the other per-slot rows."""
        p = self.past.shape[1]
        prefix = torch.full((len(slots), MAX_SEQUENCES, p), _ANY, dtype=torch.long)
        last = torch.zeros(len(slots), MAX_SEQUENCES, dtype=torch.long)
        used = torch.zeros(len(slots), MAX_SEQUENCES, dtype=torch.bool)
        for row, seqs in enumerate(sequences):
            for w, seq in enumerate(seqs or ()):
                if len(seq) > 1:
                    prefix[row, w, p - len(seq) + 1:] = torch.tensor(seq[:-1])
                last[row, w], used[row, w] = seq[-1], True
        index = to_device(slots, self.past.device, torch.long)
        self.prefix[index] = to_device(prefix, self.past.device)
        self.last[index] = to_device(last, self.past.device)
        self.used[index] = to_device(used, self.past.device)
        self.past[index] = _NONE

    def first(self, slots: torch.Tensor, done: torch.Tensor, tokens: torch.Tensor) -> None:
        """Prefill drew each finished prompt's first token: its slot's past is that token alone (set, not
        shifted in: a prefill graph's warm-up runs it too). Capturable."""
        one = torch.full((slots.shape[0], self.past.shape[1]), _NONE, dtype=torch.long, device=slots.device)
        one[:, -1] = tokens
        self.past[slots] = torch.where(done[:, None], one, self.past[slots])

    def add(self, emitted: torch.Tensor, accepted: torch.Tensor) -> None:
        """A round emitted emitted[s, :accepted[s]] for slots [0, S): shift them into the past. Capturable."""
        s, p = emitted.shape[0], self.past.shape[1]
        both = torch.cat([self.past[:s], emitted], 1)
        self.past[:s] = both.gather(1, accepted[:, None].long() + torch.arange(p, device=emitted.device))

    def apply(self, logits: torch.Tensor, rows: torch.Tensor | slice, tree: DraftTree | None = None,
              ancestors: torch.Tensor | None = None) -> torch.Tensor:
        """logits [S, N, V] of slots `rows`: each node's banned last tokens -inf. tree and its ancestor mask
        ancestors [S, N, N] (the verify mask): the round's, whose nodes' pasts go on with their drafted paths;
        None: N = 1 draw after the output alone (prefill's). Capturable, a dozen ops whatever the depth."""
        past = self.past[rows]
        s, n = logits.shape[:2]
        p = past.shape[1]
        j = torch.arange(p, device=logits.device)  # columns newest first: j tokens back from the node's own
        if tree is None or tree.max_depth == 0 or tree.size == 1:
            context = past[:, None, :].expand(s, n, p)
        else:
            depths = tree.depths[:, :, None]
            # Each node's path by depth (its ancestor at depth k, itself included: one product over the verify
            # mask; float64, exact for token ids, and never TF32), then j back from it: the path down to depth
            # 1, then the output, newest first.
            by_depth = torch.nn.functional.one_hot(tree.depths, tree.max_depth + 1).to(torch.float64)
            path = torch.bmm(ancestors.to(torch.float64), by_depth * tree.tokens[:, :, None].to(torch.float64))
            drafted = path.round().long().gather(2, (depths - j).clamp(0, tree.max_depth))
            output = past.gather(1, (p - 1 - (j - depths)).clamp(0, p - 1).flatten(1)).view(s, n, p)
            context = torch.where(j < depths, drafted, output).flip(-1)  # the newest last
        prefix = self.prefix[rows][:, None]  # [S, 1, W, P]
        hit = ((prefix == _ANY) | (prefix == context[:, :, None, :])).all(-1) & self.used[rows][:, None]  # [S, N, W]
        ban = torch.where(hit, float("-inf"), float("inf"))
        last = self.last[rows][:, None].expand(s, n, -1)
        return logits.float().scatter_reduce(2, last, ban, reduce="amin", include_self=True)
