"""One speculative round over a batch of slots: draft, build tree, verify, derive, walk, commit.

Autoregressive decoding (no drafter: the tree is the root alone) and the DFlash chain (one child per
depth) are the same round with a different tree. Nothing in a round reads a device value on the
host; the engine synchronises once per round, after `commit`, to read the emitted tokens.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from treeflash.kv_cache import KVCache, append_layout
from treeflash.models.dflash import DFlashDrafter
from treeflash.models.transformer import Transformer
from treeflash.sampling import SamplingTensors, derive
from treeflash.tree import DraftTree, Walk, ancestor_mask, build_tree, root_only, walk

METHODS = ("none", "dflash", "ddtree")
STAGES = ("draft", "tree", "verify", "derive_walk", "commit")


@dataclass(frozen=True)
class SpecConfig:
    method: str = "none"  # "none" (autoregressive), "dflash" (chain) or "ddtree" (tree)
    tree_budget: int = 64  # draft nodes per round, ddtree only

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise ValueError(f"spec must be one of {METHODS}, got {self.method!r}")
        if isinstance(self.tree_budget, bool) or not isinstance(self.tree_budget, int) or self.tree_budget < 1:
            raise ValueError(f"tree_budget must be a positive integer, got {self.tree_budget!r}")


def rows_per_round(spec: SpecConfig, drafter: DFlashDrafter | None) -> int:
    """Cache rows a round may write past a slot's committed length."""
    if drafter is None or spec.method == "none":
        return 1
    d = drafter.config
    nodes = d.depth if spec.method == "dflash" else spec.tree_budget
    return max(1 + nodes, d.block_size)


@dataclass
class SlotState:
    """Per-slot device state of the running batch."""

    seq_lens: torch.Tensor  # [S] committed tokens (rows of the target and drafter caches)
    bonus: torch.Tensor  # [S] next root token: emitted, not yet in the caches
    active: torch.Tensor  # [S] bool: the slot holds a running request


@dataclass
class RoundResult:
    tree: DraftTree
    walk: Walk
    stage_seconds: dict[str, float] = field(default_factory=dict)


class Speculator:
    """Owns the target, the optional drafter and their caches; runs prefill and rounds."""

    def __init__(self, target: Transformer, drafter: DFlashDrafter | None, spec: SpecConfig,
                 slots: int, capacity: int, time_stages: bool = True):
        if spec.method != "none" and drafter is None:
            raise ValueError(f"spec={spec.method!r} needs a draft model")
        self.target, self.drafter, self.spec = target, drafter if spec.method != "none" else None, spec
        self.device = target.embed_tokens.weight.device
        self.capacity = capacity
        self.cache = target.new_cache(slots, capacity)
        self.draft_cache = self.drafter.new_cache(slots, capacity) if self.drafter else None
        self.capture = self.drafter.config.target_layer_ids if self.drafter else ()
        zeros = lambda dtype: torch.zeros(slots, dtype=dtype, device=self.device)  # noqa: E731
        self.state = SlotState(zeros(torch.long), zeros(torch.long), zeros(torch.bool))
        self.time_stages = time_stages

    # --- prefill ---------------------------------------------------------------------------------
    @torch.inference_mode()
    def prefill(self, slot: int, prompt: list[int], chunk: int = 512) -> torch.Tensor:
        """Run a prompt into `slot`'s caches, in chunks; returns the logits after its last token [V]."""
        cache, draft_cache = self.cache.slot(slot), self.draft_cache.slot(slot) if self.drafter else None
        ids = torch.tensor(prompt, dtype=torch.long, device=self.device)[None]
        for start in range(0, len(prompt), chunk):
            piece = ids[:, start:start + chunk]
            n = piece.shape[1]
            causal = torch.ones(n, n, dtype=torch.bool, device=self.device).tril()[None]
            seq = torch.tensor([start], device=self.device)
            rows, mask = append_layout(seq, causal, start + n)
            hidden, features = self.target(piece, rows, cache, rows, mask, self.capture)
            if self.drafter:
                self.drafter.add_context(self.drafter.context_features(self.target, features), rows, draft_cache, rows)
        self.state.seq_lens[slot] = len(prompt)
        self.state.active[slot] = True
        return self.target.logits(hidden[0, -1])

    def set_bonus(self, slot: int, token: int) -> None:
        self.state.bonus[slot] = token

    def release(self, slot: int) -> None:
        self.state.seq_lens[slot] = 0
        self.state.active[slot] = False

    # --- the round -------------------------------------------------------------------------------
    @torch.inference_mode()
    def round(self, num_slots: int, sampling: SamplingTensors, kv_bound: int) -> RoundResult:
        """One round over slots [0, num_slots); `kv_bound` >= every running slot's committed length.

        Slots without a request run along (their results are ignored): a prefix of the slots keeps
        every tensor a view, with no gathers of the caches.
        """
        s = self.state
        state = SlotState(*(t[:num_slots] for t in (s.seq_lens, s.bonus, s.active)))
        cache = _prefix(self.cache, num_slots)
        clock = _StageClock(self.device, self.time_stages)

        logprobs = self.draft(state, sampling, kv_bound)
        clock.lap("draft")
        tree = self.build(state.bonus, logprobs)
        clock.lap("tree")
        positions = state.seq_lens[:, None] + tree.depths
        logits, features = self.verify(tree, positions, state, cache, kv_bound)
        clock.lap("verify")
        derived = derive(logits, sampling, positions + 1)
        accepted = walk(tree, derived)
        clock.lap("derive_walk")
        self.commit(accepted, features, state, cache, num_slots)
        clock.lap("commit")
        return RoundResult(tree, accepted, clock.seconds)

    def draft(self, state: SlotState, sampling: SamplingTensors, kv_bound: int) -> torch.Tensor | None:
        """Draft log-probs [S, block_size - 1, V] from one drafter pass (None without a drafter)."""
        if self.drafter is None:
            return None
        cache = _prefix(self.draft_cache, state.bonus.shape[0])
        logits = self.drafter.draft(self.target, state.bonus, state.seq_lens, cache, kv_bound)
        # Rank drafts by the drafter's guess of each request's *tempered* distribution.
        return torch.log_softmax(logits / sampling.temperature[:, None, None], dim=-1)

    def build(self, bonus: torch.Tensor, logprobs: torch.Tensor | None) -> DraftTree:
        if logprobs is None:
            return root_only(bonus)
        if self.spec.method == "dflash":
            return build_tree(bonus, logprobs, budget=logprobs.shape[1], branching=1)
        return build_tree(bonus, logprobs, budget=self.spec.tree_budget)

    def verify(self, tree: DraftTree, positions: torch.Tensor, state: SlotState, cache: KVCache, kv_bound: int):
        """One target forward over root + nodes at their depth positions, ancestor-only mask.

        Returns the logits at every node [S, N, V] and the drafter's features at every node (or None).
        """
        rows, mask = append_layout(state.seq_lens, ancestor_mask(tree), kv_bound + tree.size)
        hidden, features = self.target(tree.tokens, positions, cache, rows, mask, self.capture)
        return self.target.logits(hidden), self.drafter.context_features(self.target, features) if features else None

    def commit(self, accepted: Walk, features: torch.Tensor | None, state: SlotState, cache: KVCache,
               num_slots: int) -> None:
        """Keep the accepted path's KV rows, give the drafter their features, advance the slots."""
        cache.compact(state.seq_lens, accepted.path)
        if self.drafter is not None:
            path_features = features.gather(1, accepted.path[:, :, None].expand(-1, -1, features.shape[-1]))
            rows = state.seq_lens[:, None] + torch.arange(accepted.path.shape[1], device=self.device)
            self.drafter.add_context(path_features, rows, _prefix(self.draft_cache, num_slots), rows)
        state.bonus.copy_(accepted.emitted.gather(1, (accepted.accepted - 1)[:, None])[:, 0])
        # Idle slots stay put, so their garbage rounds never write past the cache.
        state.seq_lens.add_(accepted.accepted * state.active)


def _prefix(cache: KVCache, slots: int) -> KVCache:
    return KVCache([k[:slots] for k in cache.keys], [v[:slots] for v in cache.values])


class _StageClock:
    """Wall time per stage. On a GPU each lap synchronises, so it is off on the fast path."""

    def __init__(self, device: torch.device, enabled: bool):
        self.enabled, self.cuda = enabled, device.type == "cuda"
        self.seconds: dict[str, float] = {}
        self.last = time.perf_counter()

    def lap(self, stage: str) -> None:
        if not self.enabled:
            return
        if self.cuda:
            torch.cuda.synchronize()
        now = time.perf_counter()
        self.seconds[stage] = now - self.last
        self.last = now
