"""Typed settings of drafter training (no torch import: the CLI reads the defaults cheaply)."""

from __future__ import annotations

from dataclasses import dataclass, field


def default_gamma(block_size: int) -> float:
    """(block_size - 2) / 2: 7 for blocks of 16, the DFlash paper's value there; shorter blocks decay faster."""
    return max(1.0, (block_size - 2) / 2)


@dataclass(frozen=True)
class TrainConfig:
    steps: int = 2000
    batch_size: int = 16  # sequences per step
    blocks_per_seq: int = 32  # anchored blocks per sequence
    lr: float = 6e-4
    warmup_steps: int = 100
    min_lr_ratio: float = 0.05  # the cosine decays to lr * min_lr_ratio
    weight_decay: float = 0.01
    grad_clip: float = 1.0
    gamma: float = 7.0  # position-decay of the loss weights
    distill: float = 0.0  # share of the loss against the target's distribution (soft labels)
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("steps", "batch_size", "blocks_per_seq"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        if not self.lr > 0 or not self.gamma > 0 or self.warmup_steps < 0:
            raise ValueError("lr and gamma must be positive, warmup_steps non-negative")
        # clip_grad_norm_ with a negative norm flips the gradient (the loss then rises), with 0 zeroes it.
        if not self.grad_clip > 0:
            raise ValueError(f"grad_clip must be positive, got {self.grad_clip}")
        if self.weight_decay < 0 or not 0 <= self.min_lr_ratio <= 1:
            raise ValueError(f"weight_decay must be >= 0 and min_lr_ratio in [0, 1], got {self.weight_decay}, "
                             f"{self.min_lr_ratio}")
        if not 0 <= self.distill <= 1:
            raise ValueError(f"distill must be in [0, 1], got {self.distill}")


@dataclass(frozen=True)
class TrainDrafterOptions:
    out: str
    target: str | None = None  # None: the embedded default model
    revision: str | None = None  # a Hub target's branch, tag or commit (None: its main branch)
    prompts: str = "sharegpt"
    num_prompts: int = 4000  # training prompts; each gets one response per sampling mode
    num_eval_prompts: int = 16  # held-out prompts for the acceptance evaluation
    max_prompt_tokens: int = 256
    max_new_tokens: int = 256
    sampled_temperature: float = 0.2  # the target's recommended sampling (SmolLM2's model card)
    sampled_top_p: float = 0.9
    extra_temperatures: tuple[float, ...] = ()  # one more response per prompt at each (top_p 1)
    samples_per_prompt: int = 1  # responses per prompt in each sampled mode (greedy: one)
    gen_batch_size: int = 64  # engine slots (max_num_seqs) while generating data
    data_dir: str | None = None
    data_minutes: float | None = None  # start no new generation request after this long
    num_layers: int = 2
    block_size: int = 16
    target_layer_ids: tuple[int, ...] | None = None
    mask_token_id: int | None = None  # default: the last row of the target's embedding table
    init_std: float = 0.02
    init_from: str | None = None  # a drafter of the same shape, or fewer layers, to start from (else random)
    train: TrainConfig = field(default_factory=TrainConfig)
    train_minutes: float | None = None  # fit the optimiser steps (not the evaluations) into this long
    eval_every: int = 500
    eval_budget: int = 64
    eval_max_new_tokens: int = 128
    eval_batch_size: int = 32
    checkpoint_every: int = 250
    checkpoint_dir: str | None = None
    log_every: int = 20
    device: str | None = None
    draft_vocab_size: int = 0  # > 0: ship the N most frequent response tokens as the draft vocabulary
    save_dtype: str = "bfloat16"
    max_shard_mb: float = 15.0
    progress: bool | None = None  # tqdm bars: None = only on a terminal

    def __post_init__(self) -> None:
        # Checked before anything runs: a bad value found later would cost the data stage, and one stored in
        # the data cache's settings would hold the cache against the corrected command.
        for name in ("num_prompts", "max_prompt_tokens", "max_new_tokens", "gen_batch_size", "num_layers",
                     "eval_every", "eval_budget", "eval_max_new_tokens", "eval_batch_size", "checkpoint_every",
                     "log_every"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        if self.num_eval_prompts < 0:
            raise ValueError(f"num_eval_prompts must be >= 0, got {self.num_eval_prompts}")
        if not self.sampled_temperature > 0 or not 0 < self.sampled_top_p <= 1:
            raise ValueError(f"the sampled mode needs a temperature > 0 and top_p in (0, 1], got "
                             f"{self.sampled_temperature}, {self.sampled_top_p}")
        if self.data_minutes is not None and self.data_minutes < 0:
            raise ValueError(f"data_minutes must be >= 0 (0: the responses already cached), got {self.data_minutes}")
        if self.train_minutes is not None and not self.train_minutes > 0:
            raise ValueError(f"train_minutes must be positive, got {self.train_minutes}")
        if not self.max_shard_mb > 0:
            raise ValueError(f"max_shard_mb must be positive, got {self.max_shard_mb}")
        if self.draft_vocab_size < 0:
            raise ValueError(f"draft_vocab_size must be >= 0 (0: none), got {self.draft_vocab_size}")
        if self.samples_per_prompt < 1:
            raise ValueError(f"samples_per_prompt must be at least 1, got {self.samples_per_prompt}")
        temps = self.extra_temperatures
        if not all(t > 0 for t in temps) or len(set(temps)) != len(temps):
            raise ValueError(f"extra temperatures must be distinct and positive (greedy data is always made), got {temps}")
