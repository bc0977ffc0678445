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

import functools
import math
from dataclasses import dataclass

import torch

from treeflash.attention import CausalMask
from treeflash.kv_cache import PrefixKV
from treeflash.models.dflash import DFlashDrafter
from treeflash.models.transformer import Transformer


# Batches are right-padded to a multiple of this many positions: a handful of sequence lengths over a run
# instead of one per batch, so attention kernels chosen (and, on cuDNN, planned) per length are made a few
# times, not every step. Padding changes no value: no real position sees a padded one.
PAD_MULTIPLE = 64
# Label rows per chunk of the lm_head's loss (`head_loss`): its [rows, vocabulary] float32 intermediates
# stay ~0.8 GB at SmolLM2's 49,152 tokens instead of ~6 GB each for a whole step's ~30k labels.
HEAD_CHUNK = 4096


@dataclass(frozen=True)
class SequenceBatch:
    tokens: torch.Tensor  # [B, L] prompt + response, right-padded with 0
    lengths: torch.Tensor  # [B] real length of each row
    starts: torch.Tensor  # [B] position of the first response token (= prompt length)
    longest: int  # the longest real length (L is it padded up to a multiple)

    @staticmethod
    def collate(sequences: list[tuple[list[int], list[int]]], device, pad_multiple: int = 1) -> "SequenceBatch":
        """(prompt_ids, response_ids) pairs -> one batch, right-padded to a multiple of `pad_multiple`."""
        lengths = [len(p) + len(r) for p, r in sequences]
        longest = max(lengths)
        tokens = torch.zeros(len(sequences), -(-longest // pad_multiple) * pad_multiple, dtype=torch.long)
        for row, (p, r) in enumerate(sequences):
            tokens[row, :len(p) + len(r)] = torch.tensor(p + r, dtype=torch.long)
        return SequenceBatch(tokens.to(device), torch.tensor(lengths, device=device),
                             torch.tensor([len(p) for p, _ in sequences], device=device), longest)


def sample_anchors(batch: SequenceBatch, blocks: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Up to `blocks` distinct anchors per row among response positions with a token after them.

    Returns anchors [B, n] and valid [B, n]; rows with fewer candidates pad with invalid anchors
    parked on the row's first response position (they still see context, so attention stays finite).
    The draw uses `generator` on the CPU, so a seed gives the same anchors on every device.
    """
    # Over the real positions only: the same draw whatever the batch is padded to.
    b, length = batch.tokens.shape[0], batch.longest
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
    hidden, captured = target(tokens, positions, PrefixKV(), None, CausalMask(b, length),
                              drafter.config.target_layer_ids)
    return drafter.context_features(target, captured), hidden


@dataclass(frozen=True)
class LossOutput:
    loss: torch.Tensor  # scalar, differentiable
    accuracy: torch.Tensor  # [block_size - 1] top-1 accuracy per depth
    chain_length: torch.Tensor  # scalar: mean 1 + correct leading depths per block (a greedy-chain proxy)
    labels: int  # predicted tokens in the batch


def drafter_loss(drafter: DFlashDrafter, target: Transformer, batch: SequenceBatch, anchors: torch.Tensor,
                 valid: torch.Tensor, gamma: float, distill: float = 0.0, head_chunk: int = HEAD_CHUNK) -> LossOutput:
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
    mask = block_attention_mask(anchors, length, size)[:, None]  # the same for every head
    hidden = drafter(blocks.flatten(1, 2), block_positions, PrefixKV(list(keys), list(values)), None, mask)
    hidden = hidden.view(b, n, size, -1)[:, :, 1:]
    labels, has_label = block_labels(batch, anchors, valid, size)
    # Only positions with a label go through the (vocabulary-wide) lm_head.
    target_ids = labels[has_label]
    weights = decay_weights(size, gamma, anchors.device).expand_as(labels)[has_label]
    soft_hidden = None
    if distill > 0:
        # The target's distribution for token a + k comes from its logits at a + k - 1.
        before = (anchors[..., None] + torch.arange(size - 1, device=anchors.device))[has_label]
        rows = torch.arange(b, device=anchors.device)[:, None, None].expand_as(has_label)[has_label]
        soft_hidden = target_hidden[rows, before]
    loss, hit = head_loss(lambda h: drafter.logits(h, target.output_weight), hidden[has_label], target_ids,
                          weights / weights.sum().clamp_min(1e-9), target.logits, soft_hidden, distill, head_chunk)
    with torch.no_grad():
        correct = torch.zeros_like(has_label)
        correct[has_label] = hit
        accuracy = correct.sum((0, 1)) / has_label.sum((0, 1)).clamp_min(1)
        chain = 1 + correct.int().cumprod(-1).sum(-1).float()
        chain_length = chain[valid].mean() if bool(valid.any()) else torch.tensor(math.nan)
    return LossOutput(loss, accuracy.float(), chain_length, int(has_label.sum()))


def head_loss(logits_of, hidden: torch.Tensor, labels: torch.Tensor, weights: torch.Tensor, soft_logits_of=None,
              soft_hidden: torch.Tensor | None = None, distill: float = 0.0, chunk: int = HEAD_CHUNK
              ) -> tuple[torch.Tensor, torch.Tensor]:
    """sum_i weights_i * CE_i over label rows, CE_i = (1 - distill) * -log p_i(labels_i) + distill * the
    cross-entropy against softmax(soft_logits_of(soft_hidden_i)), with p_i = softmax(logits_of(hidden_i));
    and argmax p_i == labels_i [N]. Differentiable in `hidden` [N, H] only.

    The same value as F.cross_entropy over all rows at once, made `chunk` rows at a time, each chunk's gradient
    with it (`_HeadLoss`), so the [N, vocabulary] logits and labels are never whole (~6 GB each in float32 at
    SmolLM2's vocabulary for a step's ~30k labels)."""
    if distill > 0 and soft_hidden is None:
        raise ValueError("distill > 0 needs the target's hidden states for the soft labels")
    if distill == 0:
        soft_logits_of = soft_hidden = None
    return _HeadLoss.apply(hidden, labels, weights, logits_of, soft_logits_of, soft_hidden, distill, chunk)


def chunk_cross_entropy(logits: torch.Tensor, soft_logits: torch.Tensor | None, labels: torch.Tensor,
                        weights: torch.Tensor, distill: float) -> tuple[torch.Tensor, torch.Tensor]:
    """One chunk of `head_loss`: logits, soft_logits [C, V] (any float dtype) -> (weighted CE sum, argmax hits)."""
    wide = torch.promote_types(logits.dtype, torch.float32)  # 16-bit logits in float32, float64 as it is
    logp = torch.log_softmax(logits.to(wide), -1)
    ce = -logp.gather(1, labels[:, None])[:, 0]
    if soft_logits is not None:
        soft = -(torch.softmax(soft_logits.to(wide), -1) * logp).sum(-1)
        ce = (1 - distill) * ce + distill * soft
    return (weights * ce).sum(), logits.argmax(-1) == labels


@functools.cache
def _compiled_cross_entropy():
    # One compiled function per process (rows dynamic, vocabulary constant): Inductor fuses the softmaxes, the
    # product with the soft labels and their backward into a few kernels, each reading a chunk's logits once.
    return torch.compile(chunk_cross_entropy, dynamic=None, fullgraph=True)


def _cross_entropy_for(logits: torch.Tensor):
    """`chunk_cross_entropy` compiled on CUDA (the CPU never compiles), eager elsewhere: the same values up to
    the fused kernels' float32 rounding."""
    if logits.device.type != "cuda":
        return chunk_cross_entropy
    torch._dynamo.maybe_mark_dynamic(logits, 0)
    return _compiled_cross_entropy()


class _HeadLoss(torch.autograd.Function):
    """`head_loss`: a chunk's logits, loss and gradient in `hidden` made together in the forward and let go; the
    backward only scales the gradients kept ([N, H], the size of `hidden`). The lm_head is frozen: nothing else
    needs a gradient."""

    @staticmethod
    def forward(ctx, hidden, labels, weights, logits_of, soft_logits_of, soft_hidden, distill, chunk):
        total = torch.zeros((), dtype=torch.promote_types(hidden.dtype, torch.float32), device=hidden.device)
        grads, hits = [], []
        wanted = hidden.requires_grad  # (not under no_grad: then the value alone)
        for start in range(0, hidden.shape[0], chunk):
            part = slice(start, start + chunk)
            # (A Function's forward runs without autograd: only the chunk's own graph is turned on.)
            soft = None if soft_hidden is None else soft_logits_of(soft_hidden[part])
            with torch.set_grad_enabled(wanted):
                h = hidden[part].detach().requires_grad_(wanted)
                logits = logits_of(h)
                loss, hit = _cross_entropy_for(logits)(logits, soft, labels[part], weights[part], distill)
                if wanted:
                    grads.append(torch.autograd.grad(loss, h)[0])
            total += loss.detach()
            hits.append(hit)
        ctx.save_for_backward(torch.cat(grads) if grads else torch.zeros_like(hidden))
        hit = torch.cat(hits) if hits else labels.new_zeros(0, dtype=torch.bool)
        ctx.mark_non_differentiable(hit)
        return total, hit

    @staticmethod
    def backward(ctx, grad_total, grad_hit):
        (grad,) = ctx.saved_tensors
        return grad * grad_total, None, None, None, None, None, None, None
