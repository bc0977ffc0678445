"""The training loop: AdamW, linear warm-up then cosine decay, gradient clipping, bf16 autocast on CUDA,
and checkpoints that resume exactly.

Every random choice is a function of (seed, step): the batch at step s comes from a seeded
permutation of the examples, its anchors from a generator seeded with (seed, s). A checkpoint
therefore holds only the drafter's weights, AdamW's moments (safetensors) and the step (JSON),
and a resumed run takes the same steps an uninterrupted one would.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import warnings
from dataclasses import asdict
from pathlib import Path

import torch

from treeflash.models.dflash import DFlashDrafter
from treeflash.models.kernels import COMPILED, use_fast_path
from treeflash.models.transformer import Transformer
from treeflash.train.config import TrainConfig
from treeflash.train.data import Example
from treeflash.train.loss import PAD_MULTIPLE, LossOutput, SequenceBatch, drafter_loss, sample_anchors


def learning_rate(cfg: TrainConfig, step: int, total_steps: int) -> float:
    """Linear warm-up over `warmup_steps`, then cosine decay to lr * min_lr_ratio at `total_steps`."""
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    span = max(1, total_steps - cfg.warmup_steps)
    progress = min(1.0, (step - cfg.warmup_steps) / span)
    floor = cfg.lr * cfg.min_lr_ratio
    return floor + (cfg.lr - floor) * 0.5 * (1 + math.cos(math.pi * progress))


def batch_indices(num_examples: int, batch_size: int, seed: int, step: int) -> list[int]:
    """Examples of step `step`: consecutive slices of per-epoch seeded permutations (no state kept)."""
    out, first = [], step * batch_size
    for flat in range(first, first + batch_size):
        epoch, at = divmod(flat, num_examples)
        perm = _permutation(num_examples, seed, epoch)
        out.append(int(perm[at]))
    return out


_PERMUTATIONS: dict[tuple[int, int, int], torch.Tensor] = {}


def _permutation(n: int, seed: int, epoch: int) -> torch.Tensor:
    key = (n, seed, epoch)
    if key not in _PERMUTATIONS:
        _PERMUTATIONS.clear()  # one epoch at a time is enough
        _PERMUTATIONS[key] = torch.randperm(n, generator=torch.Generator().manual_seed(seed * 100_003 + epoch))
    return _PERMUTATIONS[key]


class Trainer:
    """Trains `drafter` (float32 master weights) against a frozen `target` on `examples`."""

    def __init__(self, drafter: DFlashDrafter, target: Transformer, examples: list[Example], cfg: TrainConfig,
                 total_steps: int | None = None):
        if not examples:
            raise ValueError("no training examples (every response was shorter than two tokens?)")
        self.drafter, self.target, self.examples, self.cfg = drafter, target, examples, cfg
        self.device = next(drafter.parameters()).device
        self.total_steps = total_steps or cfg.steps
        self.step = 0
        for p in target.parameters():
            p.requires_grad_(False)
        if self.device.type == "cuda":
            # The frozen target runs without autograd: one GEMM for q/k/v and for gate/up, and each norm,
            # rotary and silu one compiled kernel, as at inference (models/kernels.py).
            use_fast_path(target, fused=True, kernels=COMPILED)
        params = [p for p in drafter.parameters()]
        decay = [p for p in params if p.ndim >= 2]
        no_decay = [p for p in params if p.ndim < 2]  # norms
        self.optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": cfg.weight_decay},
                                            {"params": no_decay, "weight_decay": 0.0}],
                                           lr=cfg.lr, betas=(0.9, 0.95), eps=1e-8)

    def batch(self, step: int) -> tuple[SequenceBatch, torch.Tensor, torch.Tensor]:
        picked = [self.examples[i] for i in batch_indices(len(self.examples), self.cfg.batch_size, self.cfg.seed, step)]
        batch = SequenceBatch.collate([(e.prompt_ids, e.response_ids) for e in picked], self.device, PAD_MULTIPLE)
        generator = torch.Generator().manual_seed(self.cfg.seed * 1_000_003 + step)
        anchors, valid = sample_anchors(batch, self.cfg.blocks_per_seq, generator)
        return batch, anchors, valid

    def train_step(self) -> tuple[LossOutput, float, float]:
        """One optimiser step; returns the loss output, the learning rate and the gradient norm."""
        self.drafter.train()
        lr = learning_rate(self.cfg, self.step, self.total_steps)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        batch, anchors, valid = self.batch(self.step)
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.device.type == "cuda"):
            out = drafter_loss(self.drafter, self.target, batch, anchors, valid, self.cfg.gamma,
                               self.cfg.distill)
        self.optimizer.zero_grad(set_to_none=True)
        out.loss.backward()
        grad_norm = float(torch.nn.utils.clip_grad_norm_(self.drafter.parameters(), self.cfg.grad_clip))
        self.optimizer.step()
        self.step += 1
        return out, lr, grad_norm

    # --- checkpoints -------------------------------------------------------------------------------
    def save_checkpoint(self, directory: str | Path, extra: dict | None = None, keep: int = 2) -> Path:
        """directory/step-NNNNNNN/{drafter,optimizer}.safetensors + state.json; `latest` names the newest.

        `latest` is replaced atomically after the checkpoint is complete, so an interruption mid-write
        leaves the previous checkpoint in charge.
        """
        from safetensors.torch import save_file

        directory = Path(directory)
        path = directory / f"step-{self.step:07d}"
        path.mkdir(parents=True, exist_ok=True)
        names = {p: n for n, p in self.drafter.named_parameters()}
        save_file({n: p.detach().contiguous().cpu() for p, n in names.items()}, str(path / "drafter.safetensors"))
        moments = {}
        for group in self.optimizer.param_groups:
            for p in group["params"]:
                for key, value in self.optimizer.state.get(p, {}).items():
                    moments[f"{names[p]}::{key}"] = value.detach().contiguous().cpu()
        save_file(moments, str(path / "optimizer.safetensors"))
        state = {"step": self.step, "total_steps": self.total_steps, "config": asdict(self.cfg), **(extra or {})}
        (path / "state.json").write_text(json.dumps(state, indent=1))
        tmp = directory / "latest.tmp"
        tmp.write_text(path.name)
        os.replace(tmp, directory / "latest")
        for old in sorted(directory.glob("step-*"))[:-keep]:
            shutil.rmtree(old)
        return path

    def load_checkpoint(self, directory: str | Path, identity: dict | None = None) -> dict | None:
        """Resume from directory/latest if there is one; returns its state (None: nothing to resume).

        identity: what the checkpoint must have been made for (the drafter's shape, the target's
        fingerprint; saved in its state by `save_checkpoint(extra=...)`): resuming with another is refused,
        not trained on under a new meaning. A damaged newest checkpoint (a cut file) gives way to the one
        kept before it, with a warning.
        """
        directory = Path(directory)
        if not (directory / "latest").is_file():
            return None
        newest = directory / (directory / "latest").read_text().strip()
        candidates = [newest] + sorted((p for p in directory.glob("step-*") if p != newest), reverse=True)
        errors = []
        for path in candidates:
            try:
                state, weights, moments = _read_checkpoint(path)
            except CheckpointDamaged as e:
                errors.append(str(e))
                continue
            if errors:
                warnings.warn(f"{errors[0]}; resuming from {path.name} instead", stacklevel=2)
            self._check(path, state, weights, identity or {})
            self._restore(state, weights, moments)
            return state
        raise ValueError(f"{directory}: no checkpoint can be read ({'; '.join(errors)}); delete the directory to "
                         f"start again")

    def _check(self, path: Path, state: dict, weights: dict, identity: dict) -> None:
        # Checkpoints from before the distill option trained without it.
        if {"distill": 0.0, **state["config"]} != asdict(self.cfg):
            raise ValueError(f"{path} was trained with other settings ({state['config']}); "
                             f"resume with the same options or use another --out")
        for key, value in identity.items():
            if key in state and state[key] != value:
                raise ValueError(f"{path} was made for another {key} ({state[key]}, now {value}); resume with the "
                                 f"same target and drafter options or use another --out")
        shapes = {n: tuple(p.shape) for n, p in self.drafter.named_parameters()}
        if {n: tuple(t.shape) for n, t in weights.items()} != shapes:
            raise ValueError(f"{path} holds a drafter of another shape; resume with the same drafter options "
                             f"or use another --out")

    def _restore(self, state: dict, weights: dict, moments: dict) -> None:
        with torch.no_grad():
            for name, p in self.drafter.named_parameters():
                p.copy_(weights[name])
        params = dict(self.drafter.named_parameters())
        # The param groups are rebuilt identically by __init__; the learning rate is set every step.
        self.optimizer.state.clear()
        for key, value in moments.items():
            name, field = key.split("::")
            p = params[name]
            self.optimizer.state.setdefault(p, {})[field] = value.to(p.device) if field != "step" else value
        self.step, self.total_steps = state["step"], state["total_steps"]


class CheckpointDamaged(ValueError):
    pass


def _read_checkpoint(path: Path) -> tuple[dict, dict, dict]:
    from safetensors.torch import load_file

    try:
        state = json.loads((path / "state.json").read_text(encoding="utf-8"))
        weights = load_file(str(path / "drafter.safetensors"))
        moments = load_file(str(path / "optimizer.safetensors"))
    except Exception as e:  # a missing or cut file: json's, safetensors' or the OS's error
        raise CheckpointDamaged(f"{path}: damaged checkpoint ({type(e).__name__}: {e})") from None
    if not isinstance(state, dict) or not {"step", "total_steps", "config"} <= set(state):
        raise CheckpointDamaged(f"{path}: damaged checkpoint (state.json lacks step, total_steps or config)")
    return state, weights, moments
