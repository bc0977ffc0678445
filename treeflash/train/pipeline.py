"""`treeflash train-drafter` end to end: prompts -> the target's responses -> training -> a drafter directory.

Output directory layout (re-running the same command resumes every stage):
  data/        the generated responses (`data.py`), unless --data-dir puts them elsewhere
  checkpoint/  resumable training state (`loop.py`), unless --checkpoint-dir puts it elsewhere
  drafter/     the drafter in the z-lab format (updated at every evaluation and checkpoint, final at the end)
  history.json training and evaluation records; loss.png, acceptance.png their plots
"""

from __future__ import annotations

import dataclasses
import functools
import json
import time
from pathlib import Path

import torch

from treeflash.config import ModelConfig, RopeConfig
from treeflash.models.dflash import DFlashDrafter, DraftVocab, DrafterConfig, default_target_layer_ids, save_drafter
from treeflash.models.transformer import Transformer
from treeflash.provenance import git_commit, source_digest
from treeflash.train.config import TrainDrafterOptions
from treeflash.train.data import (SamplingMode, generate_responses, prompt_token_ids, sampling_modes,
                                  target_fingerprint)
from treeflash.train.loop import Trainer
from treeflash.train.own_prompts import own_prompts
from treeflash.train.prompts import load_prompts, split_prompts


CHAT_TEMPLATE_ROOM = 256  # tokens a chat template may add around a cut prompt (system prompt, role markers)
# Prompt tokens the generator prefills per engine step: enough to fill hundreds of slots in a few
# batched forwards, where one chunk per step would admit ~3 requests a step.
GEN_PREFILL_TOKENS = 32768
# The generator admits newcomers once 1/16 of its slots are free: an admission is an eager prefill
# forward + first-token draw (host work comparable to the round itself at 512 slots), which admitting
# one by one would pay on almost every step as responses end at different times.
GEN_ADMIT_FRACTION = 16
SAVE_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def drafter_config(target: ModelConfig, opts: TrainDrafterOptions) -> DrafterConfig:
    """Qwen3-style layers of the target's width (its heads, MLP size, RoPE base) reading its features."""
    # (dense layers with full attention whatever the target's are: no experts, windows, sinks, NoPE layers or
    # Gemma's norms; a target whose embedding is scaled (Gemma's) gives the block's raw embedding the same scale,
    # as the z-lab format says it, since the reference package embeds with the raw weights)
    layers = dataclasses.replace(
        target, architecture="Qwen3ForCausalLM", num_layers=opts.num_layers, qk_norm=True, qkv_bias=False,
        o_bias=False, mlp_bias=False, tie_word_embeddings=False, rope=RopeConfig(theta=target.rope.theta),
        bos_token_id=None, eos_token_ids=(), experts=None, sliding_window=None, window_layers=(),
        attention_sinks=False, nope_layers=(), norm_offset=False, sandwich_norms=False, embed_scale=None,
        activation="silu", local_rope=None, local_rope_layers=())
    ids = opts.target_layer_ids or default_target_layer_ids(target.num_layers, opts.num_layers)
    mask = target.vocab_size - 1 if opts.mask_token_id is None else opts.mask_token_id
    cfg = DrafterConfig(layers=layers, block_size=opts.block_size, mask_token_id=mask,
                        target_layer_ids=tuple(ids), num_target_layers=target.num_layers,
                        input_embedding_scale=target.embed_scale or 1.0)
    cfg.check_target(target)
    return cfg


def init_drafter(cfg: DrafterConfig, std: float, seed: int, target: Transformer) -> DFlashDrafter:
    """float32 master weights on the target's device: matrices ~ N(0, std), norms 1 (Hugging Face's
    initialisation), except the final norm, which starts as the target's: both feed the same lm_head."""
    drafter = DFlashDrafter(cfg).float()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in drafter.parameters():
            if p.ndim >= 2:
                p.copy_(torch.randn(p.shape, generator=g) * std)
        # (a Gemma norm's weight w scales by 1 + w; the drafter's norms scale by their weight)
        drafter.norm.weight.copy_(target.norm.weight.float().cpu() + (1.0 if target.norm.offset else 0.0))
    return drafter.to(target.embed_tokens.weight.device)


class StepCount:
    """--train-minutes as a number of optimiser steps, from the measured step time.

    Measured three times: steps can stay slower for a while after the first ones (on the H200 steps 5-25 of
    the sixth SmolLM2 run took 278 ms and the later ones ~160 ms, so 8 minutes bought 4.4; in the thirteenth,
    steps 25-125 took 206 ms and 100-200 167 ms, so a count at 125 would leave a fifth of the minutes
    unused), so the count made after step 25 (timed from step 5, after the one-time costs) only holds until
    the one made after step 125 (timed over the 100 steps between), and that one until the one after step
    325 (the 200 steps between). The first two come before a usual warm-up ends, where the count does not
    yet change the learning rate; the last moves the cosine that has just begun by a few percent at most."""

    MARKS = (5, 25, 125, 325)  # steps after the first; a count at each but the first

    def __init__(self, minutes: float, start: float, cap: int):
        self.seconds, self.start, self.cap = 60 * minutes, start, cap
        self.mark: tuple[int, float] | None = None

    def after(self, done: int, step: int, now: float) -> tuple[int, float] | None:
        """After `done` steps of this run (now at `step`, clock `now`): (total steps, seconds per step) when
        a count is made, else None."""
        if done not in self.MARKS:
            return None
        count = None
        if self.mark is not None:
            per_step = (now - self.mark[1]) / (done - self.mark[0])
            count = max(step + 1, min(self.cap, step + int((self.seconds - (now - self.start)) / per_step))), per_step
        self.mark = done, now
        return count


def start_from(drafter: DFlashDrafter, directory: str) -> None:
    """Copy the weights of the drafter in `directory` (e.g. a shipped one, to train it on more data) into
    `drafter`; its block, mask token, target layers and every tensor it has must match in shape.

    `drafter` may have more layers than that one (to grow it): its extra layers, on top, start as
    identities, their attention and MLP output projections zeroed (each layer only adds to the
    residual stream), so training resumes from the same drafts and then learns what they add.
    """
    from treeflash.checkpoint import load_drafter

    source = load_drafter(directory, "cpu", torch.float32)
    a, b = drafter.config, source.config
    mine = (a.block_size, a.mask_token_id, tuple(a.target_layer_ids), a.num_target_layers)
    theirs = (b.block_size, b.mask_token_id, tuple(b.target_layer_ids), b.num_target_layers)
    shapes = {n: tuple(p.shape) for n, p in drafter.named_parameters()}
    other = {n: tuple(p.shape) for n, p in source.named_parameters()}
    if mine != theirs or b.layers.num_layers > a.layers.num_layers or any(shapes.get(n) != s for n, s in other.items()):
        raise ValueError(f"--init-from {directory}: that drafter (block, mask id, target layers, layers: {theirs}, "
                         f"{b.layers.num_layers} layers) does not match these options ({mine}, "
                         f"{a.layers.num_layers} layers) or its tensors differ in shape")
    weights = dict(source.named_parameters())
    with torch.no_grad():
        for name, p in drafter.named_parameters():
            if name in weights:
                p.copy_(weights[name])
            elif name.endswith(("o_proj.weight", "down_proj.weight")):  # a layer above the source's
                p.zero_()


def _release_cached_memory(device: torch.device) -> None:
    import gc

    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


class _Log:
    def __init__(self, path: Path):
        self.path, self.start = path, time.monotonic()

    def __call__(self, message: str) -> None:
        from tqdm import tqdm

        line = f"[{time.monotonic() - self.start:7.1f}s] {message}"
        tqdm.write(line)
        with open(self.path, "a") as f:
            f.write(line + "\n")


def train_drafter(opts: TrainDrafterOptions) -> dict:
    """Run every stage; returns the summary also written to history.json."""
    from tqdm import tqdm

    from treeflash.checkpoint import load_target, resolve_model_dir
    from treeflash.llm import LLM
    from treeflash.train.evaluate import AcceptanceProbe
    from treeflash.train.plots import plot_history

    out = Path(opts.out).expanduser()
    out.mkdir(parents=True, exist_ok=True)
    log = _Log(out / "train.log")
    device = torch.device(opts.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32  # the target's, as LLM picks it
    save_dtype = SAVE_DTYPES[opts.save_dtype]
    model_dir = resolve_model_dir(opts.target, opts.revision)
    log(f"target {model_dir} on {device} ({dtype}); options {json.dumps(dataclasses.asdict(opts))}")
    data_dir = Path(opts.data_dir or out / "data").expanduser()
    checkpoints = Path(opts.checkpoint_dir or out / "checkpoint").expanduser()
    for directory in (data_dir, checkpoints):  # now, not at the first checkpoint, after the steps before it
        directory.mkdir(parents=True, exist_ok=True)
    fingerprint = target_fingerprint(model_dir)  # ties the data and the checkpoints to this target

    # --- data ---------------------------------------------------------------------------------------
    modes = sampling_modes(SamplingMode("sampled", opts.sampled_temperature, opts.sampled_top_p),
                           opts.extra_temperatures, opts.samples_per_prompt)
    # The context holds a cut prompt, its chat template and the response: caches sized for that, not for
    # the model's whole context (thousands of slots x 8k rows would not fit); no stage timing (it syncs).
    limit = ModelConfig.from_dir(model_dir).max_position_embeddings
    if opts.max_new_tokens + 2 > limit:  # a prompt of one token at least, and its response
        raise ValueError(f"--max-new-tokens {opts.max_new_tokens} leaves no room for a prompt in the target's "
                         f"context of {limit} tokens")
    gen = LLM(str(model_dir), device=device, dtype=dtype, max_num_seqs=opts.gen_batch_size, spec="none",
              max_model_len=min(limit, opts.max_prompt_tokens + CHAT_TEMPLATE_ROOM + opts.max_new_tokens),
              time_stages=False, prefill_tokens_per_step=GEN_PREFILL_TOKENS,
              admit_batch=max(1, opts.gen_batch_size // GEN_ADMIT_FRACTION),
              cuda_graph_sizes=[opts.gen_batch_size])  # its slots stay full: one graph, not one per power of 2
    if gen.tokenizer is None:
        raise ValueError(f"{model_dir} has no tokenizer files: train-drafter tokenises its prompts with the target's")
    started = time.monotonic()
    # self:N prompts are the target's own messages, written (or read back) with the generator's engine first;
    # --data-minutes counts the responses only.
    write_own = functools.partial(own_prompts, gen, cache_dir=data_dir, seed=opts.train.seed,
                                  max_tokens=opts.max_prompt_tokens, progress=opts.progress, log=log)
    prompts = load_prompts(opts.prompts, write_own)
    train_prompts, eval_prompts = split_prompts(prompts, opts.num_eval_prompts, opts.train.seed)
    train_prompts = train_prompts[:opts.num_prompts]
    deadline = None if opts.data_minutes is None else time.monotonic() + 60 * opts.data_minutes
    examples = generate_responses(gen, train_prompts, data_dir, modes, opts.max_new_tokens,
                                  opts.max_prompt_tokens, opts.train.seed, deadline, opts.progress, log=log,
                                  target=fingerprint)
    eval_ids = [prompt_token_ids(gen, p, opts.max_prompt_tokens) for p in eval_prompts]
    del gen, write_own
    _release_cached_memory(device)
    tokens = sum(len(e.response_ids) for e in examples)
    log(f"data: {len(examples)} responses ({tokens} tokens) from {len(train_prompts)} prompts x {len(modes)} modes, "
        f"{time.monotonic() - started:.0f} s; {len(eval_ids)} held-out prompts")

    vocab = None
    if opts.draft_vocab_size:
        vocab = DraftVocab.most_frequent((e.response_ids for e in examples), opts.draft_vocab_size)
        kept = set(vocab.token_ids)
        covered = sum(t in kept for e in examples for t in e.response_ids) / max(1, tokens)
        log(f"draft vocabulary: the {len(kept)} most frequent response tokens cover {100 * covered:.2f}% of them")

    # --- models -------------------------------------------------------------------------------------
    target, target_cfg = load_target(model_dir, device, dtype)
    cfg = drafter_config(target_cfg, opts)
    drafter = init_drafter(cfg, opts.init_std, opts.train.seed, target)
    if opts.init_from:
        start_from(drafter, opts.init_from)
        log(f"initialised from the drafter in {opts.init_from}")
    params = sum(p.numel() for p in drafter.parameters())
    log(f"drafter: {cfg.layers.num_layers} layers, block {cfg.block_size}, target layers {list(cfg.target_layer_ids)}, "
        f"mask id {cfg.mask_token_id}, {params / 1e6:.2f} M parameters "
        f"({params * torch.finfo(save_dtype).bits / 8 / 2**20:.1f} MiB in {save_dtype})")
    if not examples:
        cut = "" if opts.data_minutes is None else f"--data-minutes {opts.data_minutes} may have ended it first; "
        raise ValueError(f"no training examples: of {len(train_prompts)} prompts x {len(modes)} modes, no response of "
                         f"two tokens or more is cached or was made ({cut}prompts longer than the context are "
                         f"skipped, as logged above)")
    trainer = Trainer(drafter, target, examples, opts.train)
    # What a checkpoint was made for: resuming with another drafter shape or target is refused.
    identity = {"drafter": json.loads(json.dumps(dataclasses.asdict(cfg))), "target": fingerprint}
    state = trainer.load_checkpoint(checkpoints, identity)
    history = state["history"] if state else {"train": [], "eval": []}
    if state:
        log(f"resumed at step {trainer.step} of {trainer.total_steps}")

    def export() -> Path:
        path = save_drafter(drafter, out / "drafter", save_dtype, int(opts.max_shard_mb * 2**20))
        if vocab is not None:
            vocab.save(path, note=f"the {len(vocab.token_ids)} most frequent tokens of the training responses")
        return path

    export()
    probe = AcceptanceProbe(str(model_dir), out / "drafter", eval_ids, device=device, dtype=dtype,
                            budget=opts.eval_budget, max_new_tokens=opts.eval_max_new_tokens,
                            max_num_seqs=opts.eval_batch_size)

    def evaluate(temperatures=(0.0,)) -> dict:
        # The probe may capture new CUDA graphs (a temperature not seen before), whose private memory pools
        # cannot use blocks the caching allocator keeps for training: hand those back first (on the H200 a
        # final evaluation ran out of memory with 126 GiB reserved but unallocated).
        _release_cached_memory(device)
        t0 = time.monotonic()
        result = {"step": trainer.step, **probe.measure(drafter, temperatures)}
        log("eval " + ", ".join(f"{k} {v:.3f}" if isinstance(v, float) else f"{k} {v}" for k, v in result.items())
            + f" ({time.monotonic() - t0:.1f} s)")
        return result

    # --- training -----------------------------------------------------------------------------------
    if not state:
        history["eval"].append(evaluate())
    train_start = time.monotonic()
    # --train-minutes counts optimiser steps only: evaluations cost what --eval-every makes them cost,
    # and an untrained drafter's evaluation (one token per round) says little about a trained one's.
    # A run resumed before its first count (step 25) counts afresh, fitting its steps into the minutes from now.
    counted = bool(state and state.get("steps_counted", True))
    counter = StepCount(opts.train_minutes, train_start, trainer.cfg.steps) \
        if opts.train_minutes is not None and not counted else None
    first_step = trainer.step
    bar = tqdm(total=trainer.total_steps, initial=trainer.step, desc="train", unit="step",
               disable=None if opts.progress is None else not opts.progress)
    window: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []  # this log line's steps, still on the device
    while trainer.step < trainer.total_steps:
        result, lr, grad_norm = trainer.train_step()
        bar.update(1)
        window.append((result.loss.detach(), result.chain_length.detach(), result.accuracy[0].detach()))
        step = trainer.step
        count = counter and counter.after(step - first_step, step, time.monotonic())
        if count:
            counted = True
            trainer.total_steps, per_step = count
            bar.total = trainer.total_steps
            log(f"{per_step * 1e3:.0f} ms/step: {trainer.total_steps} steps fit in "
                f"--train-minutes {opts.train_minutes}")
        if step % opts.log_every == 0 or step == trainer.total_steps:
            # Means over the steps since the last line: one step's loss swings more than a run's trend moves.
            loss, chain, acc1 = (_nanmean(torch.stack(values).float().tolist()) for values in zip(*window))
            record = {"step": step, "steps": len(window), "loss": loss, "lr": lr, "grad_norm": grad_norm,
                      "chain": chain, "acc1": acc1}
            window.clear()
            history["train"].append(record)
            bar.set_postfix(loss=f"{record['loss']:.3f}", chain=f"{record['chain']:.2f}")
            if opts.progress is not True:
                log(f"step {step}/{trainer.total_steps} loss {record['loss']:.4f} chain {record['chain']:.2f} "
                    f"acc@1 {record['acc1']:.3f} lr {lr:.2e} |g| {grad_norm:.2f}")
        evaluated = step % opts.eval_every == 0 and step < trainer.total_steps
        if evaluated:
            history["eval"].append(evaluate())
        checkpointed = step % opts.checkpoint_every == 0 or step == trainer.total_steps
        if checkpointed:
            trainer.save_checkpoint(checkpoints, {"history": history, **identity,
                                                  "steps_counted": counted or opts.train_minutes is None})
        if evaluated or checkpointed:
            export()  # (cheap) so an interrupted run leaves a drafter ready to use; the last step always exports
    bar.close()
    train_seconds = time.monotonic() - train_start  # evaluations included

    # --- final (the drafter on disk is the final one: the last step exported it, or a run resumed at
    # the end exported it before the probe) -------------------------------------------------------------
    final = evaluate((0.0, 1.0))
    history["eval"].append(final)
    summary = {"final_eval": final, "steps": trainer.total_steps, "train_seconds": round(train_seconds, 1),
               "examples": len(examples), "response_tokens": tokens, "parameters": params,
               "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
               "eval": {"prompts": len(eval_ids), "budget": opts.eval_budget,
                        "max_new_tokens": opts.eval_max_new_tokens},
               "options": dataclasses.asdict(opts), "git": git_commit(), "source_digest": source_digest(),
               "history": history}
    (out / "history.json").write_text(json.dumps(summary, indent=1))
    plot_history(history, out)
    log(f"done: {trainer.total_steps} steps in {train_seconds:.0f} s; drafter in {out / 'drafter'}")
    return summary


def _nanmean(values: list[float]) -> float:
    """The mean of the values that are numbers (a step with no labelled block has a NaN chain length)."""
    kept = [v for v in values if v == v]
    return sum(kept) / len(kept) if kept else float("nan")
