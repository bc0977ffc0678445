"""Where a `train-drafter` step's time goes: one step of the shipped recipe at the SmolLM2-135M shape.

Random weights at the real shapes (target: `treeflash.bench.shapes`; drafter: the shipped one's, 3 layers,
block 16, target layers 1,8,14,21,27) and random token sequences of about the data's lengths (prompts
20-256 tokens, responses 50-256, uniform: 153 on average, where the fourteenth run's averaged 208), 64
sequences x 32 anchors a step, bf16 autocast, as `treeflash train-drafter --device cuda` runs it. Times whole
steps (--distill 0.5, then 0; `--distills`) and the parts of one (the batch on the host, the target pass
alone, the loss's forward with it, backward, clipping + optimiser), synchronising between parts, then prints
torch.profiler's table of the GPU's kernels over three steps. A timing, not a test.

    python benchmarks/train_step_profile.py [--steps 20] [--warmup 100] [--batch-size 64] [--distills 0.5,0]
        [--no-profile] [--out DIR]

PYTHONPATH=OTHER_CHECKOUT times another version of the package with the same script (the JSON names it).
"""

from __future__ import annotations

import argparse
import json
import random
import time
from pathlib import Path

import torch


def main() -> None:
    from treeflash.bench.shapes import build_target, shape, target_config
    from treeflash.train.config import TrainConfig, TrainDrafterOptions
    from treeflash.train.data import Example
    from treeflash.train.loop import Trainer
    from treeflash.train.pipeline import drafter_config, init_drafter

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=100,
                    help="untimed steps first: cuDNN plans an attention per sequence length, once")
    ap.add_argument("--batch-size", type=int, default=64, help="sequences a step (the recipe's 64)")
    ap.add_argument("--distills", default="0.5,0",
                    help="comma-separated --distill values, each timed with a fresh trainer "
                         "(parts and kernels: the first)")
    ap.add_argument("--no-profile", action="store_true", help="whole steps only: no parts, no kernel table")
    ap.add_argument("--out", default=".")
    args = ap.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    tcfg = target_config(shape("smollm2-135m"))
    target = build_target(tcfg, device, torch.bfloat16 if device.type == "cuda" else torch.float32)
    opts = TrainDrafterOptions(out=".", num_layers=3, block_size=16, target_layer_ids=(1, 8, 14, 21, 27),
                               mask_token_id=16)
    rng = random.Random(0)
    examples = [Example([rng.randrange(100, 49000) for _ in range(rng.randint(20, 256))],
                        [rng.randrange(100, 49000) for _ in range(rng.randint(50, 256))]) for _ in range(4096)]
    import treeflash

    result = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
              "torch": torch.__version__, "package": _where(Path(treeflash.__file__).parent), "step_ms": {},
              "first_losses": {}, "parts_ms": {}}

    distills = [float(d) for d in args.distills.split(",")]
    for distill in distills:
        drafter = init_drafter(drafter_config(tcfg, opts), 0.02, 0, target)
        cfg = TrainConfig(steps=10**6, batch_size=args.batch_size, blocks_per_seq=32, lr=3e-4, distill=distill)
        trainer = Trainer(drafter, target, examples, cfg)
        # The first steps' losses: the same weights, batches and anchors in every version of the package.
        first = [float(trainer.train_step()[0].loss.detach()) for _ in range(min(3, args.warmup))]
        result["first_losses"][f"distill {distill}"] = first
        print(f"distill {distill}: first losses {first}", flush=True)
        for _ in range(args.warmup - len(first)):
            trainer.train_step()
        _sync(device)
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        t0 = time.perf_counter()
        for _ in range(args.steps):
            trainer.train_step()
        _sync(device)
        result["step_ms"][f"distill {distill}"] = 1e3 * (time.perf_counter() - t0) / args.steps
        peak = torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else float("nan")
        result.setdefault("peak_gib", {})[f"distill {distill}"] = round(peak, 2)
        print(f"distill {distill}: {result['step_ms'][f'distill {distill}']:.1f} ms/step, peak {peak:.1f} GiB",
              flush=True)
        if distill == distills[0] and not args.no_profile:
            result["parts_ms"] = parts(trainer, device, args.steps)
            print("parts (ms):", json.dumps(result["parts_ms"]), flush=True)
            result["kernels"] = kernels(trainer, device)
            print(result["kernels"], flush=True)
        del trainer, drafter
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "train_step_profile.json").write_text(json.dumps(result, indent=1))


def _where(package: Path) -> str:
    """The package timed, relative to the working directory where it lies below it (no machine's paths in a record)."""
    try:
        return str(package.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return package.name


def _sync(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def parts(trainer, device, steps: int) -> dict:
    """Mean milliseconds of each part of a step, timed with a synchronisation between parts."""
    from treeflash.train.loss import drafter_loss, target_pass

    times: dict[str, float] = {}

    def timed(name, fn):
        _sync(device)
        t0 = time.perf_counter()
        out = fn()
        _sync(device)
        times[name] = times.get(name, 0.0) + 1e3 * (time.perf_counter() - t0) / steps
        return out

    cfg = trainer.cfg
    for _ in range(steps):
        batch, anchors, valid = timed("batch (host)", lambda: trainer.batch(trainer.step))
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
            timed("target pass alone", lambda: target_pass(trainer.drafter, trainer.target, batch.tokens))
            out = timed("loss forward (target pass included)", lambda: drafter_loss(
                trainer.drafter, trainer.target, batch, anchors, valid, cfg.gamma, cfg.distill))
        trainer.optimizer.zero_grad(set_to_none=True)
        timed("backward", lambda: out.loss.backward())
        timed("clip + optimiser", lambda: (torch.nn.utils.clip_grad_norm_(trainer.drafter.parameters(), 1.0),
                                           trainer.optimizer.step()))
        trainer.step += 1
    return {k: round(v, 2) for k, v in times.items()}


def kernels(trainer, device) -> str:
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        for _ in range(3):
            trainer.train_step()
        _sync(device)
    key = "cuda_time_total" if device.type == "cuda" else "cpu_time_total"
    return prof.key_averages().table(sort_by=key, row_limit=30, max_name_column_width=70)


if __name__ == "__main__":
    main()
