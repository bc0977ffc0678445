"""Training data: the target's own responses to training prompts, cached on disk, resumable.

The drafter learns to predict what the target generates, so the data is the target's output, made
with this project's batched engine, at temperature 0 and at the target's recommended sampling.
Each sampling mode has one JSONL file in the cache directory; finished responses are appended in
groups (256, or 30 s' worth), on disk before the next group starts. An error or an interrupt (Ctrl-C;
`train-drafter` turns SIGTERM into one) writes every finished response on the way out, so only those
in flight are lost; a hard kill (SIGKILL, power loss) also loses those finished since the last group.
A restart generates only what is missing. A later run may ask for more modes (say, more samples per
prompt): only those are made. The cache is tied to its target (a fingerprint of its weights) and
generation settings: another target's or other settings' responses are refused, not mixed in.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from treeflash.config import ConfigError, read_json_object
from treeflash.sampling import SamplingParams
from treeflash.train.prompts import Completion, Prompt

CACHE_FORMAT = 1


@dataclass(frozen=True)
class SamplingMode:
    """One way of generating responses; `name` is the cache file's stem."""

    name: str
    temperature: float
    top_p: float = 1.0
    top_k: int = -1


GREEDY = SamplingMode("greedy", 0.0)
# SmolLM2-135M-Instruct's model card samples with temperature 0.2, top_p 0.9 (its generation_config
# recommends nothing); the default for the sampled half of the data.
RECOMMENDED_SAMPLING = SamplingMode("sampled", 0.2, 0.9)


def sampling_modes(sampled: SamplingMode, extra_temperatures: tuple[float, ...] = (),
                   samples: int = 1) -> tuple[SamplingMode, ...]:
    """Greedy once (it is deterministic), then `samples` responses per prompt in `sampled` and at each
    extra temperature (top_p 1). The first sample of a mode keeps its name, so caches made with one
    sample stay valid; the j-th is `<name>_s<j>` (no temperature name has "_"): a file, and request
    seeds, of its own."""
    if samples < 1:
        raise ValueError(f"samples per prompt must be at least 1, got {samples}")
    modes = (sampled, *(SamplingMode(f"t{t:g}", t) for t in extra_temperatures))
    return (GREEDY, *(m if j == 1 else dataclasses.replace(m, name=f"{m.name}_s{j}")
                      for m in modes for j in range(1, samples + 1)))


@dataclass(frozen=True)
class Example:
    prompt_ids: list[int]
    response_ids: list[int]


class DataCacheError(ValueError):
    """The cache directory was made with other generation settings."""


def prompt_key(prompt: Prompt) -> str:
    # A chat prompt's key is its text's (caches made before completions existed stay valid); a completion's
    # is tagged, so the same text as a chat message and as a completion are two prompts.
    text = "completion\0" + prompt.text if isinstance(prompt, Completion) else prompt
    return hashlib.sha1(text.encode("utf-8")).hexdigest()[:16]


def _request_seed(seed: int, mode: str, key: str) -> int:
    return int(hashlib.sha1(f"{seed}:{mode}:{key}".encode()).hexdigest()[:15], 16)


class ResponseCache:
    """`directory/meta.json` (the generation settings) + `directory/<mode>.jsonl` (one record per prompt).

    The settings must match the stored ones, and so must each mode the cache already has; modes it
    lacks are added (their files start empty)."""

    def __init__(self, directory: str | Path, settings: dict, modes: tuple[SamplingMode, ...]):
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.meta = self.directory / "meta.json"
        settings = {"format": CACHE_FORMAT, **settings}
        known = []
        if self.meta.is_file():
            stored = read_json(self.meta)
            known = stored.pop("modes", [])
            if "target" not in stored and "target" in settings:  # a cache from before targets were recorded
                stored["target"] = settings["target"]
            if stored != settings:
                raise DataCacheError(f"{self.directory} holds responses generated with other settings "
                                     f"({stored}, now {settings}); use another --data-dir or delete it")
        by_name = {m["name"]: m for m in known}
        for mode in map(asdict, modes):
            if by_name.setdefault(mode["name"], mode) != mode:
                raise DataCacheError(f"{self.directory} holds {mode['name']!r} responses generated with other "
                                     f"settings ({by_name[mode['name']]}, now {mode}); use another --data-dir")
        # Written with the first responses, not before: a run that fails before any leaves nothing that would
        # hold the directory against a corrected command.
        self.pending = None
        if not self.meta.is_file() or len(by_name) > len(known) or "target" not in read_json(self.meta):
            self.pending = {**settings, "modes": list(by_name.values())}

    def path(self, mode: str) -> Path:
        return self.directory / f"{mode}.jsonl"

    def records(self, mode: str) -> dict[str, dict]:
        """key -> record of every complete line (a line cut by a crash is dropped from the file)."""
        return {r["key"]: r for r in read_jsonl(self.path(mode))}

    def append(self, mode: str, records: list[dict]) -> None:
        if not records:
            return
        if self.pending is not None:
            tmp = self.meta.with_suffix(".tmp")
            tmp.write_text(json.dumps(self.pending, indent=2))
            os.replace(tmp, self.meta)
            self.pending = None
        append_jsonl(self.path(mode), records)


def read_jsonl(path: Path) -> list[dict]:
    """The records of every complete line of an `append_jsonl` file; a last line cut by a crash is dropped,
    from the file too, so the next append starts on a line of its own. No file: none."""
    if not path.is_file():
        return []
    raw = path.read_bytes()
    if raw and not raw.endswith(b"\n"):
        raw = raw[:raw.rfind(b"\n") + 1]
        path.write_bytes(raw)
    records = []
    for number, line in enumerate(raw.split(b"\n"), 1):
        if not line:
            continue
        try:  # a complete line that does not parse was damaged after it was written: not ours to drop
            records.append(json.loads(line.decode("utf-8")))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise DataCacheError(f"{path}, line {number}: damaged record ({e}); delete that line or the file "
                                 f"(its responses are then generated again)") from None
    return records


def target_fingerprint(model_dir: str | Path) -> str:
    """A short hash of a target checkpoint: every tensor's name and shape and three of its rows (the first,
    middle and last; only those are read), bf16-rounded so that a float32 and a bfloat16 copy of one model
    agree. Another model, a fine-tune of the same one included, gives another."""
    import torch
    from safetensors import safe_open

    from treeflash.checkpoint import safetensors_files

    samples = {}  # by name: one model sharded otherwise gives the same fingerprint
    for file in safetensors_files(Path(model_dir)):
        with safe_open(str(file), framework="pt") as f:
            for name in f.keys():
                part = f.get_slice(name)
                shape = tuple(part.get_shape())
                picked = (0, shape[0] // 2, shape[0] - 1) if len(shape) > 1 else ()
                rows = torch.cat([part[i:i + 1] for i in picked]) if picked else part[:]
                samples[name] = f"{name}:{shape}:".encode() + rows.to(torch.bfloat16).float().numpy().tobytes()
    h = hashlib.blake2b(digest_size=8)
    for name in sorted(samples):
        h.update(samples[name])
    return h.hexdigest()


def read_json(path: Path) -> dict:
    try:
        return read_json_object(path)
    except ConfigError as e:
        raise DataCacheError(f"{e}; delete it, or the directory") from None


def append_jsonl(path: Path, records: list[dict]) -> None:
    """Append one JSON line per record, on disk (fsync) before returning."""
    with open(path, "a", encoding="utf-8") as f:
        f.write("".join(json.dumps(r) + "\n" for r in records))
        f.flush()
        os.fsync(f.fileno())


def prompt_token_ids(llm, prompt: Prompt, max_prompt_tokens: int) -> list[int]:
    """The ids the target sees: a user message cut to `max_prompt_tokens` tokens then chat-templated, or a
    completion tokenised as `generate` does and cut to its last `max_prompt_tokens` (what it continues)."""
    if isinstance(prompt, Completion):
        return llm.encode(prompt.text)[-max_prompt_tokens:]
    tok = llm.tokenizer
    ids = tok.encode(prompt, add_special_tokens=False)
    if len(ids) > max_prompt_tokens:
        prompt = tok.decode(ids[:max_prompt_tokens])
    return llm.chat_token_ids([{"role": "user", "content": prompt}])


def generate_responses(llm, prompts: list[Prompt], cache_dir: str | Path, modes: tuple[SamplingMode, ...],
                       max_new_tokens: int, max_prompt_tokens: int, seed: int, deadline: float | None = None,
                       progress: bool | None = None, flush_every: int = 256, log=None,
                       log_every: float = 30.0, target: str | None = None,
                       flush_seconds: float = 30.0) -> list[Example]:
    """Generate (or read back) the target's response to every prompt in every mode; returns the examples.

    Requests stream through `llm`'s engine: its waiting queue is kept at twice its slots, so a slot
    is refilled as soon as a response ends (no batch ends with its slots draining one by one), and
    finished responses are appended to the cache `flush_every` at a time or every `flush_seconds` (an
    error or interrupt writes them all; a hard kill loses those since the last write). `target`: the
    target's fingerprint, part of the cache's settings. Past `deadline` (time.monotonic()) nothing new starts:
    requests not yet admitted are dropped, the running ones finish, and a later call continues from
    there. `log(message)`, if given, gets a throughput line every `log_every` seconds.
    """
    from tqdm import tqdm

    settings = {"max_new_tokens": max_new_tokens, "max_prompt_tokens": max_prompt_tokens, "seed": seed}
    cache = ResponseCache(cache_dir, settings if target is None else {**settings, "target": target}, modes)
    keys = [prompt_key(p) for p in prompts]
    done = {m.name: cache.records(m.name) for m in modes}
    # A prompt's modes are queued together, so a run cut short by the deadline has every mode's share.
    todo = iter([(i, m) for i, k in enumerate(keys) for m in modes if k not in done[m.name]])
    total = len(prompts) * len(modes)
    bar = tqdm(total=total, initial=sum(len(d) for d in done.values()), desc="data", unit="resp",
               disable=None if progress is None else not progress)
    engine = llm.engine
    queue = 2 * llm.max_num_seqs
    inflight: dict[int, tuple[int, SamplingMode, list[int]]] = {}  # request id -> (prompt index, mode, prompt ids)
    ready: dict[str, list[dict]] = {m.name: [] for m in modes}
    meter = _Throughput(engine.stats, log, log_every)
    skipped = 0
    prompt_ids: dict[int, list[int]] = {}  # a prompt's modes are queued together: template it once

    def ids_of(i: int) -> list[int]:
        if i not in prompt_ids:
            prompt_ids.clear()
            prompt_ids[i] = prompt_token_ids(llm, prompts[i], max_prompt_tokens)
        return prompt_ids[i]

    flushed = [time.monotonic()]

    def flush() -> None:
        flushed[0] = time.monotonic()
        for mode in modes:
            cache.append(mode.name, ready[mode.name])
            done[mode.name].update((r["key"], r) for r in ready[mode.name])
            ready[mode.name] = []

    try:
        while True:
            if deadline is not None and time.monotonic() >= deadline:
                todo = iter(())
                for request in [r for r in engine.waiting if r.id in inflight]:  # not started: drop
                    engine.abort(request.id)
                    del inflight[request.id]
            while len(engine.waiting) < queue and (item := next(todo, None)) is not None:
                i, mode = item
                ids = ids_of(i)
                # A prompt the generator's context cannot hold with its response is skipped, not fatal: one
                # odd prompt must not end a long run (the chat template's length is not known in advance).
                if len(ids) + max_new_tokens > llm.max_model_len:
                    skipped += 1
                    bar.update(1)
                    continue
                # Token ids are all the data needs: no text (detokenize=False saves a decode per token).
                params = SamplingParams(temperature=mode.temperature, top_p=mode.top_p, top_k=mode.top_k,
                                        max_tokens=max_new_tokens, seed=_request_seed(seed, mode.name, keys[i]),
                                        detokenize=False)
                request = llm.new_requests([ids], [params])[0]
                inflight[request.id] = (i, mode, ids)
                engine.add(request)
            if not inflight:
                break
            finished = 0
            for update in engine.step():
                request = update.request
                if request.finished and request.id in inflight:
                    i, mode, ids = inflight.pop(request.id)
                    ready[mode.name].append({"key": keys[i], "prompt_ids": ids, "response_ids": request.output_ids,
                                             "finish": request.finish_reason})
                    finished += 1
            bar.update(finished)
            waiting = sum(map(len, ready.values()))
            if waiting >= flush_every or (waiting and time.monotonic() - flushed[0] >= flush_seconds):
                flush()
            meter.tick(len(inflight))
    finally:
        flush()  # finished responses are complete: keep them whatever ended the loop
        for request_id in inflight:  # an error or an interrupt must not leave requests holding slots
            engine.abort(request_id)
        bar.close()
    meter.tick(0, final=True)
    if skipped:
        print(f"treeflash train-drafter: skipped {skipped} requests whose prompt + {max_new_tokens} new tokens "
              f"exceed the generator's context ({llm.max_model_len})")
    examples = []
    for mode in modes:
        for k in keys:
            r = done[mode.name].get(k)
            if r is not None and len(r["response_ids"]) >= 2:  # an anchor needs a token after it
                examples.append(Example(r["prompt_ids"], r["response_ids"]))
    return examples


class _Throughput:
    """Logs the generator's tokens/s and where its time went (engine.stats deltas) every `every` seconds."""

    def __init__(self, stats, log, every: float):
        self.stats, self.log, self.every = stats, log, every
        self.start = self.last = time.monotonic()
        self.first = self.mark = dataclasses.replace(stats)

    def tick(self, inflight: int, final: bool = False) -> None:
        now = time.monotonic()
        if self.log is None or (not final and now - self.last < self.every):
            return
        a, b = (self.first, self.stats) if final else (self.mark, self.stats)
        if b.steps == a.steps:
            return  # nothing generated (everything was cached)
        seconds = max(1e-9, now - (self.start if final else self.last))
        rounds = max(1, b.rounds - a.rounds)
        tokens_per_s = (b.generated_tokens - a.generated_tokens) / seconds
        round_ms = 1e3 * (b.round_seconds - a.round_seconds) / rounds
        self.log(f"data{' (all)' if final else ''}: {tokens_per_s:,.0f} tokens/s, {rounds / seconds:.1f} rounds/s "
                 f"({round_ms:.1f} ms each), prefill {b.prefill_seconds - a.prefill_seconds:.1f} s of {seconds:.1f} s "
                 f"({b.prefill_forwards - a.prefill_forwards} forwards, {b.prefill_tokens - a.prefill_tokens:,} "
                 f"tokens), {inflight} requests in flight")
        self.last, self.mark = now, dataclasses.replace(self.stats)
