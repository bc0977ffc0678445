"""Repetition, frequency and presence penalties and min_tokens (vLLM's rules), lossless under speculation.

A penalty makes a token's logit depend on the tokens generated before it. In a draft tree every node has a
past of its own: the request's output so far (counted once per slot, `PenaltyCounts.output`) plus the drafted
tokens on the node's path below the root (the root is the last emitted token, already counted). Each node is
penalised with those counts, so the distribution verification derives from at a node is the one plain
decoding would penalise and sample from at that position, and the tokens stay plain decoding's.

vLLM's order and formulas, on the float32 logits before temperature and the filters:
1. repetition_penalty r (tokens in the prompt or the output): a positive logit is divided by r, others
   multiplied by it;
2. frequency_penalty f: minus f x the token's count in the output;
3. presence_penalty p: minus p where the token is in the output.
A row without penalties (r = 1, f = p = 0) comes out bit for bit as it went in.

On CUDA `penalize` is one Triton kernel (treeflash/penalty_kernel.py), bit for bit the torch ops here.

min_tokens (`StopSuppression`) depends on a node's position alone: a stop token drawn at a position before
the request's prompt length + min_tokens gets no probability, at every node as in plain decoding.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from treeflash.transfer import to_device
from treeflash.tree import ancestor_mask


def token_rows(token_sets: list, vocab: int) -> torch.Tensor:
    """A host bool row [len(token_sets), vocab] per set of token ids (None or empty: none), for a slot's state."""
    rows = torch.zeros(len(token_sets), vocab, dtype=torch.bool)
    for row, ids in enumerate(token_sets):
        if ids:
            rows[row, torch.tensor(sorted(set(ids)), dtype=torch.long)] = True
    return rows


@dataclass
class PenaltyCounts:
    """Per slot: how often each token was generated, and which tokens the prompt holds ([slots, V])."""

    output: torch.Tensor  # int32
    prompt: torch.Tensor  # bool

    @staticmethod
    def new(slots: int, vocab: int, device) -> "PenaltyCounts":
        return PenaltyCounts(torch.zeros(slots, vocab, dtype=torch.int32, device=device),
                             torch.zeros(slots, vocab, dtype=torch.bool, device=device))

    def start(self, slots: list[int], prompts: list[list[int] | None]) -> None:
        """New requests in `slots`: nothing generated yet, their prompts' tokens seen (None: none). Queued
        through pinned memory: an admission does not wait for the round in flight."""
        index = to_device(slots, self.output.device, torch.long)
        self.output[index] = 0
        self.prompt[index] = to_device(token_rows(prompts, self.prompt.shape[1]), self.prompt.device)

    def first(self, slots: torch.Tensor, done: torch.Tensor, tokens: torch.Tensor) -> None:
        """Prefill drew each finished prompt's first token: its slot's output is that token alone (set, not
        added: a prefill graph's warm-up runs it too). Device tensors only: capturable."""
        one = torch.zeros(slots.shape[0], self.output.shape[1], dtype=self.output.dtype, device=slots.device)
        one.scatter_(1, tokens[:, None], 1)
        self.output[slots] = torch.where(done[:, None], one, self.output[slots])

    def add(self, emitted: torch.Tensor, accepted: torch.Tensor) -> None:
        """A round emitted emitted[s, :accepted[s]] for slots [0, S): count them. Capturable."""
        keep = (torch.arange(emitted.shape[1], device=emitted.device)[None, :] < accepted[:, None])
        self.output[:emitted.shape[0]].scatter_add_(1, emitted, keep.to(self.output.dtype))


def penalize(logits: torch.Tensor, repetition: torch.Tensor, frequency: torch.Tensor, presence: torch.Tensor,
             output: torch.Tensor | None, prompt: torch.Tensor, tokens: torch.Tensor | None = None,
             ancestors: torch.Tensor | None = None, tree=None, kernel: bool | None = None) -> torch.Tensor:
    """The penalised float32 logits [S, N, V] of every node.

    logits [S, N, V]; repetition / frequency / presence [S]; output [S, V] the slots' generated-token counts
    (None: nothing generated yet, as at prefill); prompt [S, V]; tokens [S, N] and ancestors [S, N, N] (node
    n sees node m: m is n or an ancestor of n, the verify mask) add each node's drafted path, root excluded.
    tree: the DraftTree tokens come from, whose parents the kernel walks instead of reading ancestors (the
    torch ops make ancestors from it where they are not given).
    kernel: one Triton kernel (treeflash/penalty_kernel.py, bit for bit these ops' output) rather than the
    torch ops; None: on CUDA, where a path comes with its tree.
    """
    if kernel is None:
        kernel = logits.is_cuda and (tokens is None or tree is not None)
    if kernel:
        from treeflash.penalty_kernel import penalize_kernel  # (Triton: imported where it runs)

        return penalize_kernel(logits, repetition, frequency, presence, output, prompt, tokens,
                               None if tree is None else tree.parents, 0 if tree is None else tree.max_depth)
    s, n, vocab = logits.shape
    # [S, 1, V] broadcast where every node has the same past (no path: drafts, prefill); [S, N, V] with paths
    counts = torch.zeros(s, 1, vocab, device=logits.device) if output is None else output[:, None, :].to(torch.float32)
    if tokens is not None and n > 1:
        counts = counts.expand(s, n, vocab).clone()
        path = (ancestors if ancestors is not None else ancestor_mask(tree)).clone()
        path[:, :, 0] = False  # the root's token is already in `output`
        counts.scatter_add_(2, tokens[:, None, :].expand(s, n, n), path.to(torch.float32))
    x = logits.float()
    seen = (counts > 0) | prompt[:, None, :]
    r = repetition[:, None, None]
    x = torch.where(seen, torch.where(x > 0, x / r, x * r), x)
    return x - frequency[:, None, None] * counts - presence[:, None, None] * (counts > 0)


@dataclass
class StopSuppression:
    """min_tokens: each slot's stop tokens [slots, V] (bool) and the first position at which one may be drawn
    [slots] (prompt length + min_tokens; 0: no suppression)."""

    stop: torch.Tensor
    stops_from: torch.Tensor

    @staticmethod
    def new(slots: int, vocab: int, device) -> "StopSuppression":
        return StopSuppression(torch.zeros(slots, vocab, dtype=torch.bool, device=device),
                               torch.zeros(slots, dtype=torch.long, device=device))

    def start(self, slots: list[int], stop_ids: list, stops_from: list[int]) -> None:
        """New requests in `slots`: their stop tokens and first stop position (queued through pinned memory)."""
        index = to_device(slots, self.stop.device, torch.long)
        self.stop[index] = to_device(token_rows(stop_ids, self.stop.shape[1]), self.stop.device)
        self.stops_from[index] = to_device(stops_from, self.stop.device, torch.long)

    def apply(self, logits: torch.Tensor, rows: torch.Tensor | slice, positions: torch.Tensor,
              columns: torch.Tensor | None = None) -> torch.Tensor:
        """logits [S, N, V] of slots `rows` drawing tokens at `positions` [S, N]: stop tokens -inf before their
        slot's first stop position. columns: the token id of each of the V logits (a draft vocabulary's; None:
        the whole vocabulary). Capturable."""
        early = positions < self.stops_from[rows][:, None]  # [S, N]
        stop = self.stop[rows] if columns is None else self.stop[rows][:, columns]
        return logits.float().masked_fill(early[:, :, None] & stop[:, None, :], float("-inf"))
