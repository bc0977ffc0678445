"""The block-diffusion training objective, many blocks per sequence in one pass.

For each sequence (prompt + the target's response) the target runs once, under no_grad, giving the
features of every position. Random anchor positions `a` in the response each open a block
[token a, MASK x (block_size - 1)] placed at positions a .. a + block_size - 1. One attention mask
lets a block see the context features strictly before its anchor (what inference has cached when
token a is the bonus) and its own block bidirectionally, and no other block. Block position k
(1..block_size-1) predicts token a + k, weighted exp(-(k-1)/gamma): early depths decide acceptance.
With `distill` > 0 part of each position's loss is the cross-entropy against the target's own
distribution for token a + k (its logits at position a + k - 1, from the same target pass): the
response token says which token the target chose, the distribution also ranks the alternatives,
which is what a tree drafts and what sampling accepts. (That part of the loss is bounded below by
the target distribution's entropy, not 0: logged losses of runs with and without it do not compare.)
The drafter pass is the inference module's own forward, over `PrefixKV` instead of a KV cache.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from treeflash.kv_cache import PrefixKV
from treeflash.models.dflash import DFlashDrafter
from treeflash.models.transformer import Transformer


@dataclass(frozen=True)
class SequenceBatch:
    tokens: torch.Tensor  # [B, L] prompt + response, right-padded with 0
    lengths: torch.Tensor  # [B] real length of each row
    starts: torch.Tensor  # [B] position of the first response token (= prompt length)

    @staticmethod
    def collate(sequences: list[tuple[list[int], list[int]]], device) -> "SequenceBatch":
        """(prompt_ids, response_ids) pairs -> one padded batch."""
        lengths = [len(p) + len(r) for p, r in sequences]
        tokens = torch.zeros(len(sequences), max(lengths), dtype=torch.long)
        for row, (p, r) in enumerate(sequences):
            tokens[row, :len(p) + len(r)] = torch.tensor(p + r, dtype=torch.long)
        return SequenceBatch(tokens.to(device), torch.tensor(lengths, device=device),
                             torch.tensor([len(p) for p, _ in sequences], device=device))


def sample_anchors(batch: SequenceBatch, blocks: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Up to `blocks` distinct anchors per row among response positions with a token after them.

    Returns anchors [B, n] and valid [B, n]; rows with fewer candidates pad with invalid anchors
    parked on the row's first response position (they still see context, so attention stays finite).
    The draw uses `generator` on the CPU, so a seed gives the same anchors on every device.
    """
    b, length = batch.tokens.shape
    pos = torch.arange(length, device=batch.tokens.device)
    ok = (pos >= batch.starts[:, None]) & (pos <= batch.lengths[:, None] - 2)
    scores = torch.rand(b, length, generator=generator).to(batch.tokens.device)
    scores = torch.where(ok, scores, torch.full_like(scores, -1.0))
    top = scores.topk(min(blocks, length), dim=1)
    valid = top.values >= 0
    anchors = torch.where(valid, top.indices, batch.starts[:, None])
    return anchors, valid


def block_attention_mask(anchors: torch.Tensor, context_len: int, block_size: int) -> torch.Tensor:
    """anchors [B, n] -> mask [B, n*block_size, context_len + n*block_size] (True = visible).

    Keys are [context positions 0..context_len-1, block 0, block 1, ...]: a block token sees the
    context strictly before its anchor and every token of its own block, nothing of other blocks.
    """
    b, n = anchors.shape
    device = anchors.device
    context = torch.arange(context_len, device=device)[None, None, :] < anchors[:, :, None]  # [B, n, C]
    context = context[:, :, None, :].expand(b, n, block_size, context_len).reshape(b, n * block_size, context_len)
    block_of = torch.arange(n * block_size, device=device) // block_size
    own_block = (block_of[:, None] == block_of[None, :])[None].expand(b, -1, -1)
    return torch.cat([context, own_block], dim=-1)


def block_labels(batch: SequenceBatch, anchors: torch.Tensor, valid: torch.Tensor,
                 block_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Targets of block positions 1..block_size-1: token a + k -> labels, has_label [B, n, block_size - 1]."""
    b, n = anchors.shape
    pos = anchors[..., None] + torch.arange(1, block_size, device=anchors.device)
    inside = pos < batch.lengths[:, None, None]
    labels = batch.tokens.gather(1, pos.clamp(max=batch.tokens.shape[1] - 1).flatten(1)).view(b, n, block_size - 1)
    return labels, inside & valid[..., None]


def decay_weights(block_size: int, gamma: float, device=None) -> torch.Tensor:
    """w_k = exp(-(k - 1) / gamma) for depths k = 1..block_size-1 (the DFlash paper's position decay)."""
    k = torch.arange(1, block_size, dtype=torch.float32, device=device)
    return torch.exp(-(k - 1) / gamma)


@torch.no_grad()
def target_pass(drafter: DFlashDrafter, target: Transformer, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One causal target forward over whole sequences [B, L] -> the drafter's features [B, L, K*H] and
    the target's final-normed hidden states [B, L, H] (its logits at a position predict the next token)."""
    b, length = tokens.shape
    positions = torch.arange(length, device=tokens.device)[None].expand(b, length)
    causal = torch.ones(length, length, dtype=torch.bool, device=tokens.device).tril()[None].expand(b, -1, -1)
    hidden, captured = target(tokens, positions, PrefixKV(), None, causal, drafter.config.target_layer_ids)
    return drafter.context_features(target, captured), hidden


@dataclass(frozen=True)
class LossOutput:
    loss: torch.Tensor  # scalar, differentiable
    accuracy: torch.Tensor  # [block_size - 1] top-1 accuracy per depth
    chain_length: torch.Tensor  # scalar: mean 1 + correct leading depths per block (a greedy-chain proxy)
    labels: int  # predicted tokens in the batch


def drafter_loss(drafter: DFlashDrafter, target: Transformer, batch: SequenceBatch, anchors: torch.Tensor,
                 valid: torch.Tensor, gamma: float, distill: float = 0.0) -> LossOutput:
    """The weighted cross-entropy of every anchored block of the batch, in one drafter pass.

    distill in [0, 1]: the share of each position's loss taken against the target's distribution
    (soft labels) instead of the response token (0: the response token alone).
    """
    b, length = batch.tokens.shape
    n, size = anchors.shape[1], drafter.config.block_size
    features, target_hidden = target_pass(drafter, target, batch.tokens)
    with torch.no_grad():
        blocks = drafter.embed_block(target, batch.tokens.gather(1, anchors))  # [B, n, size, H]
    context_positions = torch.arange(length, device=anchors.device)[None].expand(b, length)
    keys, values = zip(*drafter.context_kv(features, context_positions))
    block_positions = (anchors[..., None] + torch.arange(size, device=anchors.device)).flatten(1)
    mask = block_attention_mask(anchors, length, size)
    hidden = drafter(blocks.flatten(1, 2), block_positions, PrefixKV(list(keys), list(values)), None, mask)
    hidden = hidden.view(b, n, size, -1)[:, :, 1:]
    labels, has_label = block_labels(batch, anchors, valid, size)
    # Only positions with a label go through the (vocabulary-wide) lm_head.
    logits = drafter.logits(hidden[has_label], target.output_weight).float()
    target_ids = labels[has_label]
    weights = decay_weights(size, gamma, logits.device).expand_as(labels)[has_label]
    if distill > 0:
        with torch.no_grad():
            # The target's distribution for token a + k comes from its logits at a + k - 1. One mixed
            # label distribution, distill * target's + (1 - distill) * the response token's, keeps a
            # single [labels, V] copy besides the logits (a step has ~30k labels over 49k tokens).
            before = (anchors[..., None] + torch.arange(size - 1, device=anchors.device))[has_label]
            rows = torch.arange(b, device=anchors.device)[:, None, None].expand_as(has_label)[has_label]
            mixed = torch.softmax(target.logits(target_hidden[rows, before]).float(), -1).mul_(distill)
            mixed[torch.arange(len(target_ids), device=mixed.device), target_ids] += 1 - distill
        ce = F.cross_entropy(logits, mixed, reduction="none")
    else:
        ce = F.cross_entropy(logits, target_ids, reduction="none")
    loss = (weights * ce).sum() / weights.sum().clamp_min(1e-9)
    with torch.no_grad():
        correct = torch.zeros_like(has_label)
        correct[has_label] = logits.argmax(-1) == target_ids
        accuracy = correct.sum((0, 1)) / has_label.sum((0, 1)).clamp_min(1)
        chain = 1 + correct.int().cumprod(-1).sum(-1).float()
        chain_length = chain[valid].mean() if bool(valid.any()) else torch.tensor(math.nan)
    return LossOutput(loss, accuracy.float(), chain_length, int(has_label.sum()))
